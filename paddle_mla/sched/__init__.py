"""The scheduler, the request state it owns, and the plain-data step messages it sends the model
runner (output.py): plain host logic, no tensors."""
