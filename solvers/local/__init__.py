"""Local improvement beyond the exact size: annealing, layer partitions, weak-node relocation, and the
incremental scorer they share."""
