"""Triton MLA kernels: latent-cache write, decode plan, split-KV decode, cache read + interleave,
varlen causal prefill. Each has a plain-tensor reference in ``reference.py``.

Modules (import them directly; importing this package does not import Triton):
  cache_write.write_latent_cache
  decode.alloc_decode_workspace / build_decode_plan / mla_decode
  interleave.read_cache_and_interleave
  prefill.prefill_attention
"""

from paddle_mla import runtime as _runtime

_runtime.select()
