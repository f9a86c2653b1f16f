"""KV cache: the block pool with prefix caching (pure Python) and the latent cache tensors
(kv_cache.py, imported only after the runtime is selected)."""
