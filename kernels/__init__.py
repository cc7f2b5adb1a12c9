"""Triton and torch kernels of every workload, and the symmetric-memory runtime they share."""
