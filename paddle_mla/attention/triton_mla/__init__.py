"""Triton MLA kernels: latent-cache write, decode plan, split-KV decode, cache read + interleave,
varlen causal prefill. Each has a plain-tensor reference in ``reference.py``.

Modules (import them directly; importing this package does not import Triton):
  cache_write.write_latent_cache
  decode.alloc_decode_workspace / build_decode_plan / mla_decode
  interleave.read_cache_and_interleave
  prefill.prefill_attention

Importing this package selects no runtime; its modules refuse to import before
``paddle_mla.runtime.select()``.
"""
