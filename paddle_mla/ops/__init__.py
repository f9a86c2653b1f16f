"""ops: the custom metadata operators (C++/CUDA) and their plain-tensor references.

Importing this package selects no runtime; its tensor modules refuse to import before
``paddle_mla.runtime.select()``.
"""
