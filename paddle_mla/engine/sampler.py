"""Token sampler: greedy, temperature, top-k, top-p, and a seed per request.

Random rows use the Gumbel-max trick with counter-based noise: the noise of request r at its n-th
token depends only on (seed_r, n, token id), never on the batch it shares or on a global generator
state. So a seeded request gives the same tokens alone or in any batch, after preemption too.
All math is in plain tensor ops (portable across the runtimes); nothing is read back here.
"""

from __future__ import annotations

import numpy as np
from paddle_mla import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

_M = 2**31              # hash state stays in [0, 2**31) so int64 products never overflow
_MUL = 0x45D9F3B        # odd 27-bit multiplier of a 32-bit integer finalizer
_VOCAB_MUL = 0x2545F49


def _mix(h):
    h = ((h ^ (h >> 16)) * _MUL) % _M
    h = ((h ^ (h >> 16)) * _MUL) % _M
    return h ^ (h >> 16)


def uniform_noise(seeds, steps, vocab_size: int):
    """u in (0, 1), float32 [B, V], a pure function of (seed, step, token id)."""
    base = _mix((seeds % _M) ^ _mix(steps % _M))
    vocab = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    h = _mix((base.unsqueeze(1) + vocab.unsqueeze(0) * _VOCAB_MUL) % _M)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 2**23)


def sample(logits, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
           seeds: np.ndarray, steps: np.ndarray):
    """logits float32 [B, V] -> token ids int64 [B] (device). Host arrays are per row."""
    greedy_ids = torch.argmax(logits, dim=-1)
    random_rows = temperature > 0
    if not random_rows.any():
        return greedy_ids
    device = logits.device
    vocab = logits.shape[-1]

    def up(a, dtype):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device).to(dtype)

    temps = up(np.where(random_rows, temperature, 1.0).astype(np.float32), torch.float32)
    x = logits / temps.unsqueeze(1)
    k = np.where((top_k > 0) & (top_k < vocab), top_k, vocab).astype(np.int64)
    need_k = bool((k < vocab).any())
    need_p = bool((top_p < 1.0).any())
    if need_k or need_p:
        order = torch.argsort(x, dim=-1, descending=True)
        sorted_x = torch.gather(x, 1, order)
        neg_inf = torch.full_like(sorted_x, float("-inf"))
        if need_k:
            rank = torch.arange(vocab, dtype=torch.int64, device=device).unsqueeze(0)
            sorted_x = torch.where(rank < up(k, torch.int64).unsqueeze(1), sorted_x, neg_inf)
        if need_p:
            probs = torch.softmax(sorted_x, dim=-1)
            before = torch.cumsum(probs, dim=-1) - probs
            sorted_x = torch.where(before > up(top_p.astype(np.float32), torch.float32).unsqueeze(1),
                                   neg_inf, sorted_x)
        x = torch.empty_like(x).scatter_(1, order, sorted_x)
    u = uniform_noise(up(seeds.astype(np.int64), torch.int64), up(steps.astype(np.int64), torch.int64), vocab)
    gumbel = -torch.log(-torch.log(u))
    sampled = torch.argmax(x + gumbel, dim=-1)
    return torch.where(up(random_rows, torch.bool), sampled, greedy_ids)
