"""Shared by the Triton kernel tests (CPU interpreter and GPU): the kernel modules in one
namespace, and paged block tables in random physical order."""

from types import SimpleNamespace

import numpy as np


def kernel_namespace(device: str) -> SimpleNamespace:
    from paddle_mla.attention.triton_mla import cache_write, decode, interleave, prefill, reference
    from paddle_mla.platform.tensor_api import torch

    return SimpleNamespace(torch=torch, ref=reference, cw=cache_write, dec=decode, il=interleave, pf=prefill,
                           dev=device)


def random_block_tables(rng, seq_lens, page: int, extra_blocks: int = 3):
    """(tables int32 [B, max_blocks + 1], -1 padded, num_blocks) with blocks in random physical order."""
    need = [max(1, -(-int(s) // page)) for s in seq_lens]
    nb = sum(need) + extra_blocks
    perm = rng.permutation(nb)
    bt = np.full((len(seq_lens), max(need) + 1), -1, dtype=np.int32)
    pos = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[pos:pos + n]
        pos += n
    return bt, nb
