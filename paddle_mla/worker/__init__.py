"""The model runner and what it owns: persistent input batch, sampler, CUDA graphs, memory profile."""
