"""paddle_mla: offline batch inference for Multi-head Latent Attention models.

This top-level module imports no tensor library: the runtime (PaddlePaddle through its
torch proxy, or PyTorch) is chosen by ``paddle_mla.runtime.select`` before any tensor code
is imported. See ARCHITECTURE section 2.
"""

__version__ = "0.1.0"
