"""Executors of a plan: NumPy (program order or random interleavings, the race checker), CuPy eager, CuPy graph."""
