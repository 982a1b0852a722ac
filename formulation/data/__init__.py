"""Package data: the GPU catalog, calibrated efficiencies, model presets and the published runs used for
validation and calibration. Shipped with the package so that a plain `pip install` plans and validates."""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
MODELS_DIR = DATA_DIR / "models"
REFERENCE_DIR = DATA_DIR / "reference"
