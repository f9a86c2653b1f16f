"""``paddle-mla bench``: seeded workloads, interleaved repeated runs, table / JSON / plot.

No tensor library is imported here; the engine is built by the caller after the runtime is chosen.
"""
