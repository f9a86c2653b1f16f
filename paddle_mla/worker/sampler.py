"""Token sampler on the device: logit processing (penalties, min_tokens masks), greedy /
temperature / top-k / top-p sampling with a seed per row, and logprobs, packed for ONE read.

Order per row, as vLLM applies it: logprobs are taken from the raw logits; then the min_tokens
mask (eos and stop ids to -inf) and the penalties (repetition over prompt + output, frequency and
presence over the output; the token counts per slot on the device, ``penalties.py``); greedy
rows take the argmax of these processed logits; random rows divide by the temperature, keep the
top-k / top-p set and draw with the Gumbel-max trick.

The noise is counter-based: the noise of request r at its n-th token depends only on
(seed_r, n, token id), never on the batch it shares or on a global generator state. So a seeded
request gives the same tokens alone or in any batch, after preemption too.
All math is in plain tensor ops (portable across the runtimes); ``read_to_host`` is the only read.
The per-row parameters reach the device through ``device_arrays``: the model runner uploads them
with the step's other inputs in one pinned copy and passes the tensors as ``dev``; without ``dev``
(tests, tools) each array is uploaded where it is used.
"""

from __future__ import annotations

import numpy as np
from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

from paddle_mla.ops import batch_invariant  # noqa: E402
from paddle_mla.worker.penalties import PenaltyState, penalty_arrays, staged  # noqa: E402
from paddle_mla.worker.sampling_batch import SamplingBatch  # noqa: E402

_M = 2**31              # hash state stays in [0, 2**31) so int64 products never overflow
_MUL = 0x45D9F3B        # odd 27-bit multiplier of a 32-bit integer finalizer
_VOCAB_MUL = 0x2545F49


def _mix(h):
    h = ((h ^ (h >> 16)) * _MUL) % _M
    h = ((h ^ (h >> 16)) * _MUL) % _M
    return h ^ (h >> 16)


def device_arrays(batch: SamplingBatch) -> dict[str, np.ndarray]:
    """The host arrays the sampler needs on the device this step, typed as it uses them. Only what
    this batch's rows use is listed (no penalty arrays without penalties, etc.)."""
    vocab = batch.vocab_size
    random_rows = batch.temperature > 0
    out = {}
    if len(batch.mask_index):
        out["mask_index"] = batch.mask_index.astype(np.int64)
    if batch.penalty is not None:
        out.update(penalty_arrays(batch.penalty))
    if random_rows.any():
        out.update(temps=np.where(random_rows, batch.temperature, 1.0).astype(np.float32),
                   seeds=batch.seeds.astype(np.int64), steps=batch.steps.astype(np.int64),
                   random_rows=random_rows)
        if (batch.top_k < vocab).any():
            out["top_k"] = np.where((batch.top_k > 0) & (batch.top_k < vocab), batch.top_k, vocab).astype(np.int64)
        if (batch.top_p < 1.0).any():
            out["top_p"] = np.asarray(batch.top_p, dtype=np.float32)
    if 0 < len(batch.logprob_rows) < batch.num_rows:
        out["logprob_rows"] = batch.logprob_rows.astype(np.int64)
    return out


def uniform_noise(seeds, steps, vocab_size: int):
    """u in (0, 1), float32 [B, V], a pure function of (seed, step, token id)."""
    base = _mix((seeds % _M) ^ _mix(steps % _M))
    vocab = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    h = _mix((base.unsqueeze(1) + vocab.unsqueeze(0) * _VOCAB_MUL) % _M)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 2**23)


def apply_min_tokens(logits, batch: SamplingBatch, dev: dict | None = None):
    """-inf at the stop ids of the rows that have not yet generated min_tokens tokens."""
    if len(batch.mask_index) == 0:
        return logits
    idx = staged(dev, "mask_index", batch.mask_index, torch.int64, logits.device)
    mask = torch.zeros(logits.numel(), dtype=logits.dtype, device=logits.device)
    mask = mask.scatter_(0, idx, torch.full((len(batch.mask_index),), float("-inf"), dtype=logits.dtype,
                                            device=logits.device))
    return logits + mask.reshape(logits.shape)


def apply_penalties(logits, batch: SamplingBatch, dev: dict | None = None, penalties: PenaltyState | None = None):
    """The batch's admissions into ``penalties`` (the runner's per-slot token state), then the
    penalties of its penalized rows (``PenaltyState.apply``). Without ``penalties`` (tests,
    tools) a state of this batch's own holds the rows that ``build_sampling_batch`` admitted."""
    step = batch.penalty
    if step is None:
        return logits
    if penalties is None:
        penalties = PenaltyState(batch.num_rows, batch.vocab_size, logits.device)
    penalties.admit_step(step, dev)
    return penalties.apply(logits, step, dev)


def process_logits(logits, batch: SamplingBatch, dev: dict | None = None, penalties: PenaltyState | None = None):
    """Raw logits -> the logits that greedy rows take the argmax of (new tensor; input untouched)."""
    return apply_penalties(apply_min_tokens(logits, batch, dev), batch, dev, penalties)


def mask_top_k_top_p(x, top_k: np.ndarray, top_p: np.ndarray, dev: dict | None = None):
    """-inf outside each row's top-k set and outside the smallest prefix whose mass reaches top_p.
    ``top_k`` holds the vocabulary size where no top-k applies."""
    device, vocab = x.device, x.shape[-1]
    need_k = bool((top_k < vocab).any())
    need_p = bool((top_p < 1.0).any())
    if not (need_k or need_p):
        return x
    order = torch.argsort(x, dim=-1, descending=True)
    sorted_x = torch.gather(x, 1, order)
    neg_inf = torch.full_like(sorted_x, float("-inf"))
    if need_k:
        rank = torch.arange(vocab, dtype=torch.int64, device=device).unsqueeze(0)
        sorted_x = torch.where(rank < staged(dev, "top_k", top_k, torch.int64, device).unsqueeze(1), sorted_x, neg_inf)
    if need_p:
        probs = torch.exp(sorted_x - batch_invariant.logsumexp(sorted_x)) if batch_invariant.enabled() \
            else torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs
        limit = staged(dev, "top_p", top_p.astype(np.float32), torch.float32, device).unsqueeze(1)
        sorted_x = torch.where(before > limit, neg_inf, sorted_x)
    return torch.empty_like(x).scatter_(1, order, sorted_x)


def sample(logits, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
           seeds: np.ndarray, steps: np.ndarray, dev: dict | None = None):
    """Processed logits float32 [B, V] -> token ids int64 [B] (device). Host arrays are per row;
    top_k 0 or -1 (or >= V) means all tokens."""
    greedy_ids = torch.argmax(logits, dim=-1)
    random_rows = temperature > 0
    if not random_rows.any():
        return greedy_ids
    device = logits.device
    vocab = logits.shape[-1]
    temps = staged(dev, "temps", np.where(random_rows, temperature, 1.0).astype(np.float32), torch.float32, device)
    k = np.where((top_k > 0) & (top_k < vocab), top_k, vocab).astype(np.int64)
    x = mask_top_k_top_p(logits / temps.unsqueeze(1), k, np.asarray(top_p, dtype=np.float64), dev)
    u = uniform_noise(staged(dev, "seeds", seeds.astype(np.int64), torch.int64, device),
                      staged(dev, "steps", steps.astype(np.int64), torch.int64, device), vocab)
    gumbel = -torch.log(-torch.log(u))
    sampled = torch.argmax(x + gumbel, dim=-1)
    return torch.where(staged(dev, "random_rows", random_rows, torch.bool, device), sampled, greedy_ids)


def log_softmax(x):
    if batch_invariant.enabled():
        return x - batch_invariant.logsumexp(x)
    return x - torch.logsumexp(x, dim=-1, keepdim=True)


def sample_step(logits, batch: SamplingBatch, dev: dict | None = None, penalties: PenaltyState | None = None):
    """Raw logits [B, V] -> one float64 tensor to read: B sampled ids, then per logprob row
    [sampled logprob, max_top ids, max_top logprobs] (see ``sampling_batch.unpack``).
    Only the logprob rows pay for the log-softmax and the top-N."""
    return sample_step_ids(logits, batch, dev, penalties)[0]


def sample_step_ids(logits, batch: SamplingBatch, dev: dict | None = None, penalties: PenaltyState | None = None):
    """``sample_step``'s packed tensor and the sampled ids (int64 [B], on the device). With
    ``penalties`` the penalized rows' sampled ids are counted into their slots on the device."""
    logits = logits.to(torch.float32)
    processed = process_logits(logits, batch, dev, penalties)
    ids = sample(processed, batch.temperature, batch.top_k, batch.top_p, batch.seeds, batch.steps, dev)
    if penalties is not None and batch.penalty is not None:
        penalties.record(batch.penalty, ids, dev)
    parts = [ids.to(torch.float64)]
    num_lp = len(batch.logprob_rows)
    if num_lp:
        raw, lp_ids = logits, ids
        if num_lp < batch.num_rows:
            rows = staged(dev, "logprob_rows", batch.logprob_rows, torch.int64, logits.device)
            raw, lp_ids = logits[rows], ids[rows]
        lp = log_softmax(raw)     # vLLM's raw logprobs: before penalties, temperature, top-k/top-p
        cols = [torch.gather(lp, 1, lp_ids.unsqueeze(1)).to(torch.float64)]
        if batch.max_top:
            top_lp, top_ids = torch.topk(lp, batch.max_top, dim=-1)
            cols += [top_ids.to(torch.float64), top_lp.to(torch.float64)]   # float64 holds any id exactly
        parts.append(torch.cat(cols, dim=1).reshape(-1))
    return (torch.cat(parts) if len(parts) > 1 else parts[0]), ids


def read_to_host(packed) -> np.ndarray:
    """The one device-to-host read of a step (tests count calls of this function): a tensor, or
    a ``staging.PendingRead`` started earlier (waits for its event, not for the whole device)."""
    if hasattr(packed, "wait"):
        return packed.wait()
    return packed.cpu().numpy()
