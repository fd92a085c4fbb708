"""Benchmarks: verify, then time with CUDA events, then write records (``experiments/results``)."""
