"""Routing patterns and random expert weights shared by the fused MoE tests (CPU interpreter and GPU)."""

import numpy as np

# name -> how (token, k) pairs pick experts
PATTERNS = ("random", "two_full_rest_empty", "one_token_per_expert_skew", "all_full")


def routing(pattern: str, M: int, E: int, top_k: int, seed: int = 0):
    """(topk_ids int32 [M, top_k], topk_weights float32 [M, top_k]) as numpy; a token's experts are distinct."""
    rng = np.random.default_rng(seed)
    if pattern == "random":
        ids = np.argsort(rng.random((M, E)), axis=1)[:, :top_k]
    elif pattern == "two_full_rest_empty":          # the first top_k experts get every token, the others none
        ids = np.tile(np.arange(top_k), (M, 1))
    elif pattern == "one_token_per_expert_skew":    # expert 0 in every token, the rest spread, many empty
        rest = np.argsort(rng.random((M, E - 1)), axis=1)[:, :top_k - 1] + 1
        ids = np.concatenate([np.zeros((M, 1), dtype=np.int64), rest], 1)
    elif pattern == "all_full":                     # top_k == E: every expert gets every token
        assert top_k == E
        ids = np.stack([rng.permutation(E) for _ in range(M)])
    else:
        raise ValueError(pattern)
    weights = rng.random((M, top_k)).astype(np.float32) + 0.1
    return ids.astype(np.int32), weights


def expert_weights(rng, E: int, N: int, K: int, scale: float = 0.1):
    """w_gate, w_up [E, N, K]; w_down [E, K, N] as float32 numpy."""
    return (rng.standard_normal((E, N, K)).astype(np.float32) * scale,
            rng.standard_normal((E, N, K)).astype(np.float32) * scale,
            rng.standard_normal((E, K, N)).astype(np.float32) * scale)
