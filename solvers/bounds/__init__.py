"""Proven lower bounds on the iteration time of a configuration, for pruning and for honest gaps."""
