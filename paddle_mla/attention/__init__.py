"""attention: per-step metadata, the backend interface and registry, the backends and their kernels.

Importing this package selects no runtime (the engine does: docs/architecture.md, "platform"). Its tensor
modules refuse to import before ``paddle_mla.platform.runtime.select()``, so none of them can bind the
wrong ``torch``.
"""
