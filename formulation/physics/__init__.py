"""The cost and memory models: time of each piece of work and communication, bytes per GPU."""
