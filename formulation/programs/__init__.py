"""The mathematical programs built from the models: the exact program per configuration, the partition
program, the islands and the composition program for mixed GPU types."""
