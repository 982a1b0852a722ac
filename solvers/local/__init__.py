"""Local improvement beyond the exact size: annealing, layer partitions, max-min node groups, node orders on
tables, weak-node relocation, and the incremental scorer they share."""
