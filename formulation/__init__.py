"""The planning problem: inputs, cost and memory models, placement, and the single evaluator."""

from formulation.errors import InfeasibleError, InputError
from formulation.inputs.instance import Instance, instance_from_dict, load_instance
from formulation.placement import Placement, default_placement
from formulation.evaluate import Estimate, evaluate

__all__ = ["Estimate", "InfeasibleError", "InputError", "Instance", "Placement", "default_placement", "evaluate",
           "instance_from_dict", "load_instance"]
