"""paddle_mla: offline batch inference for Multi-head Latent Attention models.

This top-level module imports no tensor library: the runtime (PaddlePaddle through its
torch proxy, or PyTorch) is chosen by ``paddle_mla.platform.runtime.select`` before any tensor code
is imported. See docs/architecture.md, "platform".
"""

__version__ = "0.1.0"
