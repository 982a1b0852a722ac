"""The planning problem: inputs, cost and memory models, placement, and the single evaluator."""

from .errors import InfeasibleError, InputError
from .instance import Instance, instance_from_dict, load_instance
from .placement import Placement, default_placement
from .evaluate import Estimate, evaluate

__all__ = ["Estimate", "InfeasibleError", "InputError", "Instance", "Placement", "default_placement", "evaluate",
           "instance_from_dict", "load_instance"]
