"""attention: per-step metadata, the backend interface and registry, the backends and their kernels.

Importing this package selects no runtime (the engine does: ARCHITECTURE section 2). Its tensor
modules refuse to import before ``paddle_mla.runtime.select()``, so none of them can bind the
wrong ``torch``.
"""
