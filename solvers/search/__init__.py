"""Searches: the bound-and-prune driver, and what it runs over: the configurations of uniform clusters, the
island compositions of mixed GPU types; also the Megatron-style default placements."""
