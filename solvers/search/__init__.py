"""Search drivers: the bound-and-prune search over configurations (uniform clusters), the composition
search (mixed GPU types), and the Megatron-style default placements."""
