"""Allocation and sizing of the paged KV caches: MLA latent caches (one tensor per layer) and GQA
K/V caches (a head-major pair per layer). The block pool and scheduler are the same for both; only
the bytes a block holds differ (``kv_width``)."""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

from paddle_mla.cache.fp8_latent import row_width, storage_dtype  # noqa: E402


CPU_AUTO_CACHE_BYTES = 1 << 30   # CPU has no free-memory probe worth trusting; 1 GiB is plenty for tests


def bytes_per_block(num_layers: int, block_size: int, latent_dim: int, element_size: int) -> int:
    """``latent_dim``: elements one token stores per layer (``kv_width`` of the model)."""
    return num_layers * block_size * latent_dim * element_size


def usable_num_blocks(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """Blocks the engine could ever use: every running sequence at max_model_len (+1)."""
    return max_num_seqs * (-(-max_model_len // block_size)) + 1


def kv_width(arch, fp8: bool = False) -> int:
    """Elements one token stores per layer: K and V of every KV head (GQA), or the latent + the
    deepseek_v32 indexer key (MLA); ``fp8``: the bytes of the latent's FP8 row (``cache.fp8_latent``;
    never with an indexer: its kernels read a bf16 cache)."""
    if fp8:
        return row_width(arch.mla.latent_dim)
    if arch.family == "gqa":
        return 2 * arch.gqa.num_kv_heads * arch.gqa.head_dim
    return arch.mla.latent_dim + (arch.indexer.head_dim if arch.indexer is not None else 0)


def auto_num_blocks(device_kind: str, per_block: int, max_num_seqs: int, max_model_len: int, block_size: int,
                    gpu_memory_utilization: float) -> int:
    """CPU: blocks that fit the fixed budget, never more than the engine could ever use. (On a GPU
    the cache is sized by a profile run: ``engine.memory_profile``.)"""
    if device_kind != "cpu":
        raise ValueError("a GPU KV cache is sized by the profile run (paddle_mla.worker.memory_profile)")
    useful = usable_num_blocks(max_num_seqs, max_model_len, block_size)
    budget = CPU_AUTO_CACHE_BYTES
    fit = budget // per_block
    if fit < 1:
        raise RuntimeError(f"no memory left for the KV cache (budget {budget / 2**20:.0f} MiB); "
                           "lower max_model_len or set cache.num_blocks")
    return int(min(fit, useful))


def allocate_latent_caches(num_layers: int, num_blocks: int, block_size: int, latent_dim: int, dtype, device: str):
    """[num_blocks, block_size, 1, latent_dim] per layer (docs/architecture.md, "cache")."""
    return [torch.zeros(num_blocks, block_size, 1, latent_dim, dtype=dtype, device=device) for _ in range(num_layers)]


def allocate_gqa_caches(num_layers: int, num_kv_heads: int, num_blocks: int, block_size: int, head_dim: int,
                        dtype, device: str):
    """(K, V) per layer, each [num_kv_heads, num_blocks, block_size, head_dim] (docs/architecture.md, "cache"):
    head-major, so a KV head's blocks are its own (head-wise block tables index them)."""
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    return [(torch.zeros(*shape, dtype=dtype, device=device), torch.zeros(*shape, dtype=dtype, device=device))
            for _ in range(num_layers)]


def allocate_flat_gqa_caches(num_layers: int, total_blocks: int, block_size: int, head_dim: int, dtype,
                             device: str):
    """(K, V) per layer, each [total_blocks, block_size, head_dim]: every KV head's range of one array
    (per-head ranges of unequal size, head-wise SWA with recycling; HeadWisePool.bases places them)."""
    shape = (total_blocks, block_size, head_dim)
    return [(torch.zeros(*shape, dtype=dtype, device=device), torch.zeros(*shape, dtype=dtype, device=device))
            for _ in range(num_layers)]


def allocate_index_caches(num_layers: int, num_blocks: int, block_size: int, head_dim: int, dtype, device: str):
    """deepseek_v32 indexer keys, [num_blocks, block_size, 1, index_head_dim] per layer, same block ids."""
    return allocate_latent_caches(num_layers, num_blocks, block_size, head_dim, dtype, device)


def allocate_kv_caches(arch, num_blocks: int, block_size: int, dtype, device: str, fp8: bool = False):
    """The per-layer caches of ``arch``'s family: a head-major (K, V) pair (GQA) or one latent cache (MLA),
    ``fp8``: the MLA latents' FP8 rows (``cache.fp8_latent``)."""
    if arch.family == "gqa":
        return allocate_gqa_caches(arch.num_layers, arch.gqa.num_kv_heads, num_blocks, block_size, arch.gqa.head_dim,
                                   dtype, device)
    if fp8:   # the latents' FP8 rows (the indexer keys, never FP8, have their own cache)
        return allocate_latent_caches(arch.num_layers, num_blocks, block_size, row_width(arch.mla.latent_dim),
                                      storage_dtype(), device)
    return allocate_latent_caches(arch.num_layers, num_blocks, block_size, arch.mla.latent_dim, dtype, device)
