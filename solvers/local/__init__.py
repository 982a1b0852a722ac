"""Local improvement beyond the exact size: annealing, layer partitions, max-min node groups, weak-node
relocation, and the incremental scorer they share."""
