"""The scheduler and the request state it owns: plain host logic, no tensors."""
