"""Capacity planning: what-if sweeps over models, GPU types, node counts, batch and sequence, each cell an
ordinary plan, run in a local process pool or on Ray."""
