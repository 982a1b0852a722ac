"""Predictions against measured runs: loading the runs, validation, calibration, and the benchmark."""
