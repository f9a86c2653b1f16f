"""Plain numpy references of the sampler's logit processing (vLLM's semantics), for the sampler
unit tests and the engine tests. Written from the definitions, not from the tensor code."""

from __future__ import annotations

import numpy as np

# Upper 0.1 % points of the chi-square distribution (tables; scipy.stats.chi2.ppf(0.999, dof)).
CHI2_CRITICAL_1E3 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def penalties(logits: np.ndarray, prompt: list[int], output: list[int], presence: float, frequency: float,
              repetition: float) -> np.ndarray:
    """One row: repetition over prompt + output (positive / r, negative * r), then
    - frequency * count - presence * [count > 0] over the output."""
    x = np.array(logits, dtype=np.float64)
    for t in set(prompt) | set(output):
        x[t] = x[t] / repetition if x[t] > 0 else x[t] * repetition
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=len(x)) if output else np.zeros(len(x))
    return x - frequency * counts - presence * (counts > 0)


def min_tokens_mask(logits: np.ndarray, num_generated: int, min_tokens: int, stop_ids, eos_ids,
                    ignore_eos: bool) -> np.ndarray:
    x = np.array(logits, dtype=np.float64)
    if num_generated < min_tokens:
        for t in set(stop_ids) | (set() if ignore_eos else set(eos_ids)):
            if t < len(x):
                x[t] = -np.inf
    return x


def top_k_top_p(x: np.ndarray, k: int, p: float) -> np.ndarray:
    """Keep the k largest (k <= 0: all), then, over their renormalized probabilities, each token
    whose preceding mass (in descending order) is at most p; the rest become -inf."""
    x = np.array(x, dtype=np.float64)
    order = np.argsort(-x, kind="stable")
    keep = np.zeros(len(x), dtype=bool)
    kept = order[:k] if 0 < k < len(x) else order
    probs = np.exp(x[kept] - x[kept].max())
    probs /= probs.sum()
    before = np.cumsum(probs) - probs
    keep[kept[before <= p + 1e-6]] = True
    return np.where(keep, x, -np.inf)


def sampling_probs(logits: np.ndarray, temperature: float, k: int, p: float) -> np.ndarray:
    x = top_k_top_p(np.asarray(logits, dtype=np.float64) / temperature, k, p)
    e = np.exp(x - x.max())
    return e / e.sum()


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over the categories with probability > 0, and its degrees of freedom."""
    support = probs > 0
    expected = probs[support] * counts.sum()
    stat = float((((counts[support] - expected) ** 2) / expected).sum())
    return stat, int(support.sum()) - 1
