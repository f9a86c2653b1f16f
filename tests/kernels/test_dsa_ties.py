"""The DSA top-k tie rule, kernel level: where keys tie at the k-th score, the earlier positions win,
in ``topk_select`` exactly as in ``reference.topk_ref`` (which every path's tokens follow). Scores
built to tie (most of them zero, of both signs, or a few distinct values), over window lengths at
every edge: around ``topk``, the candidate buffer and the interpreter's 128-column blocks; every
select path (all keys, buffered, whole-window fallback), prefill windows and decode positions."""

import numpy as np
import pytest
from helpers.triton_kernel_helpers import random_block_tables

from paddle_mla.platform import runtime
from paddle_mla.attention.dsa import reference as ref
from paddle_mla.attention.dsa.key_window import KeyWindows
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch
from paddle_mla.platform.tensor_api import torch

DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")
K = 20                  # candidate buffer 64
# window lengths: 1, below / at / past K, the buffer, one and two 128-column blocks
EDGES = [1, K - 1, K, K + 1, 63, 64, 65, 127, 128, 129, 255, 256, 257]


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a)).to(DEV)


def _meta(rng, num_new, num_cached, page=16):
    num_new, num_cached = np.array(num_new, np.int32), np.array(num_cached, np.int32)
    tables, _ = random_block_tables(rng, num_new + num_cached, page)
    batch = StepBatch(token_ids=np.zeros(int(num_new.sum()), np.int64), num_new=num_new, num_cached=num_cached,
                      block_tables=tables, is_prefill=num_new > 1, sample_mask=np.ones(len(num_new), bool))
    return ForwardMeta.build(batch, page, DEV, KeyWindows(int(num_new.sum()) + 1, DEV))


def tie_heavy_scores(rng, rows: int, width: int, kind: str):
    """``zeros``: per row 50..97% exact zeros (+0.0 and -0.0 mixed, as a sum of ReLU'd heads times
    signed weights gives), the rest normal: the k-th key is usually a zero. ``few``: four values."""
    if kind == "few":
        return rng.choice(np.array([-1.0, 0.0, 0.5, 2.0], np.float32), (rows, width))
    s = rng.standard_normal((rows, width)).astype(np.float32)
    zero = rng.random((rows, width)) < rng.uniform(0.5, 0.97, (rows, 1))
    s[zero] = np.where(rng.random(int(zero.sum())) < 0.5, np.float32(0.0), np.float32(-0.0))
    return s


def _expected(scores, meta):
    """The reference's rows over each token's causal window (request positions)."""
    rows, s = [], 0
    for b in range(meta.num_reqs):
        n, c = int(meta.seq_lens_q[b]), int(meta.num_cached[b])
        for i in range(n):
            rows.append(ref.topk_ref(_t(scores[s + i:s + i + 1, :c + i + 1]), K)[0].cpu().numpy())
        s += n
    return np.stack(rows)


def test_topk_ref_takes_the_earliest_tied_keys():
    s = np.array([[0.0, 1.0, -0.0, 0.0, 2.0, 0.0, -np.inf]], np.float32)
    assert ref.topk_ref(_t(s), 4)[0].cpu().numpy().tolist() == [0, 1, 2, 4]
    assert ref.topk_ref(_t(s[:, ::-1].copy()), 3)[0].cpu().numpy().tolist() == [1, 2, 5]
    assert ref.topk_ref(_t(s), 8)[0].cpu().numpy().tolist() == [0, 1, 2, 3, 4, 5, -1, -1]


@pytest.mark.triton
@pytest.mark.parametrize("variant", [dict(), dict(append_sem="acq_rel", short_select=False, threshold_digits=3)],
                         ids=["default", "previous"])
@pytest.mark.parametrize("margin", [3, -1000, 1000], ids=["sampled", "sample_short", "sample_over"])
@pytest.mark.parametrize("kind", ["zeros", "few"])
@pytest.mark.parametrize("shape", ["decode", "prefill"])
def test_topk_select_ties_take_the_earliest(shape, kind, margin, variant):
    """The selected columns equal the reference's, tie for tie (as a set: the kernel does not sort)."""
    from paddle_mla.attention.dsa.topk_select import topk_scratch_shape, topk_select

    rng = np.random.default_rng([len(shape), len(kind), abs(margin)])
    if shape == "decode":   # (a request with no cached key is a prefill: window 1 is the prefill case's)
        meta = _meta(rng, [1] * (len(EDGES) - 1), [n - 1 for n in EDGES[1:]])
        assert meta.is_decode_only
    else:   # chunks whose windows step across the same edges, plus an empty request
        meta = _meta(rng, [K + 2, 0, 6, 6, 4], [0, 9, 59, 124, 253])
    width = meta.max_seqlen_k
    windows = {} if meta.is_decode_only else dict(ks=meta.index_ks, ke=meta.index_ke, cu_seqlens_k=meta.cu_seqlens_k)
    scratch = torch.zeros(topk_scratch_shape(meta.num_tokens, K), dtype=torch.int32, device=DEV)
    want = _expected(scores := tie_heavy_scores(rng, meta.num_tokens, width, kind), meta)
    assert (want[:, -1] >= 0).sum() > 5       # rows that need a selection
    got = topk_select(_t(scores), K, torch.full((meta.num_tokens, K), 99, dtype=torch.int64, device=DEV),
                      meta.batch_id_per_token, meta.positions, **windows, scratch=scratch, margin=margin,
                      sample=64, **variant).cpu().numpy()
    for t in range(meta.num_tokens):
        assert sorted(got[t].tolist()) == sorted(want[t].tolist()), f"row {t}"


@pytest.mark.triton
@pytest.mark.parametrize("tied,need", [(1, 1), (5, 5), (5, 0), (9, 1), (40, 17), (64, 63)])
def test_buffered_ties_pick_the_earliest_columns_in_any_order(tied, need):
    """The candidate buffer in shuffled order (as a GPU's candidate programs append it): the pick
    takes exactly ``need`` of the tied keys, those with the smallest columns."""
    from helpers.dsa_tie_probe import earliest_ties

    rng = np.random.default_rng(tied * 100 + need)
    cap = 64
    cols = rng.permutation(5000)[:cap].astype(np.int32)
    equal = np.zeros(cap, np.int32)
    equal[rng.permutation(cap)[:tied]] = 1
    taken = earliest_ties(_t(equal), _t(cols), need, cap).cpu().numpy().astype(bool)
    assert taken.sum() == need and (equal[taken] == 1).all()
    assert sorted(cols[taken].tolist()) == sorted(cols[equal == 1].tolist())[:need]
