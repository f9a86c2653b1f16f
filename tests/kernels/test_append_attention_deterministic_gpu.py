"""The CUDA ``append_attention`` op under ``batch_invariant`` (``deterministic: true``): one request's
token gets the same output bits whether it decodes alone, decodes among rows of other lengths at any
place in the batch, ends a chunk, ends a whole prefill, or shares the step with other prefills; with
uniform and head-wise tables and SWA heads, in bf16 (tensor-core prefill kernel) and fp32 (the
CUDA-core one). Decode-only steps (``decode_only``) take the dims-split form of the bf16 kernel
(head_dim 64, 96, 128); its rows must carry the row-split form's bits. With ``invariant_split`` the
rows' keys fall in fixed segments: a decode-only step splits a row over blocks by segment and merges
them. In other steps the one-token requests still split by segment (``decode_in_mixed_step``) and the
rest fold in the row-split block, 128 rows wide; with the split off (``PADDLE_MLA_GQA_DSPLIT=0``, or
head_dim 80) every row folds in the row-split block, 64 rows wide where the requests average fewer
than a block of rows (``chunk_end``, the decode contexts). The probe's bits must not depend on which
(its 1500 keys span three segments of 512). The mode's outputs also match the C++ op. Run by
scripts/gpu_tests.sh; skipped on CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.append_attention_cases import Case, CaseData, compare_outputs, gpu, make_data, rope_table, run_case
from paddle_mla.ops import append_attention as op
from paddle_mla.platform.tensor_api import torch

pytestmark = pytest.mark.gpu

PROBE_LEN = 1500                  # the probe's token sits at this position (its keys: 0..1500)
# (contexts: (cached, new) per request, the probe's index); the probe's own span ends at PROBE_LEN
CONTEXTS = {
    "decode_alone": ([(PROBE_LEN, 1)], 0),
    "decode_among_decodes": ([(100, 1), (3000, 1), (PROBE_LEN, 1), (7, 1)], 2),
    "decode_in_64_rows": ([(37 * i % 2900 + 1, 1) for i in range(31)] + [(PROBE_LEN, 1)]
                          + [(53 * i % 3100 + 1, 1) for i in range(32)], 31),
    "chunk_end": ([(PROBE_LEN - 10, 11)], 0),
    "whole_prefill": ([(0, PROBE_LEN + 1), (20, 3)], 0),   # (the first call appends the other's prefix)
    "mixed_step": ([(5, 40), (0, 300), (PROBE_LEN - 63, 64), (900, 1)], 2),
    "decode_in_mixed_step": ([(5, 40), (PROBE_LEN, 1), (0, 300), (900, 1)], 1),
}
GEOMETRIES = {   # (hq, hkv, head_dim, block_size, head_wise, (num_swa_heads, window, sink))
    "h32x8d128": (32, 8, 128, 64, False, (0, 0, 0)),
    "h20x4d128-swa": (20, 4, 128, 64, True, (2, 256, 8)),
    "h12x4d80-swa": (12, 4, 80, 16, True, (1, 100, 0)),
    "h16x2d96": (16, 2, 96, 32, False, (0, 0, 0)),
    "h8x1d64-swa": (8, 1, 64, 64, True, (1, 128, 4)),
    "h4x2d32": (4, 2, 32, 16, False, (0, 0, 0)),   # no tensor-core prefill form: no segments on any path
}


def probe_arrays(hq: int, hkv: int, d: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    n = PROBE_LEN + 1
    return tuple(rng.standard_normal((n, h, d)).astype(np.float32) for h in (hq, hkv, hkv))


def context_data(c: Case, probe, at: int) -> CaseData:
    """Random tables and other requests for case ``c``; request ``at`` carries the probe's Q/K/V."""
    base = make_data(c)
    Q, K, V = list(base.Q), list(base.K), list(base.V)
    Q[at], K[at], V[at] = probe
    return CaseData(base.tables, Q, K, V, rope_table(4000, c.rot_dim), base.num_blocks, [])


def probe_out(name: str, geom: str, dtype, decode_only: bool = False, split: int = 0) -> np.ndarray:
    hq, hkv, d, bs, head_wise, swa = GEOMETRIES[geom]
    reqs, at = CONTEXTS[name]
    c = Case(tuple(reqs), hq, hkv, d, d, True, bs, head_wise, swa, seed=len(reqs))
    out, _, _ = run_case(c, op.append_attention, dtype, gpu(), context_data(c, probe_arrays(hq, hkv, d), at),
                         batch_invariant=True, decode_only=decode_only, invariant_split=split)
    row = sum(n for _, n in reqs[:at + 1]) - 1     # the probe's last new token
    return out[row]


@pytest.mark.parametrize("split", [0, 512])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("geom", sorted(GEOMETRIES))
def test_probe_token_bits_do_not_depend_on_the_step(geom, dtype, split):
    dt = getattr(torch, dtype)
    alone = probe_out("decode_alone", geom, dt, split=split)
    assert np.isfinite(alone).all()
    for name, (reqs, _) in CONTEXTS.items():
        if name != "decode_alone":
            got = probe_out(name, geom, dt, split=split)
            assert np.array_equal(got, alone), f"{name}: max diff {np.abs(got - alone).max()}"
        if all(n == 1 for _, n in reqs):   # a decode-only step: the dims-split form where it applies
            got = probe_out(name, geom, dt, decode_only=True, split=split)
            assert np.array_equal(got, alone), f"{name}, decode_only: max diff {np.abs(got - alone).max()}"


@pytest.mark.parametrize("geom", sorted(GEOMETRIES))
def test_row_split_fold_has_the_split_rows_bits(geom, monkeypatch):
    """Every context with the segment split off (each row folds its segments in the row-split block, 64
    or 128 rows wide) against the probe decoded alone through the split and the merge kernel."""
    alone = probe_out("decode_alone", geom, torch.bfloat16, decode_only=True, split=512)
    monkeypatch.setenv("PADDLE_MLA_GQA_DSPLIT", "0")
    for name in CONTEXTS:
        got = probe_out(name, geom, torch.bfloat16, split=512)
        assert np.array_equal(got, alone), f"{name}: max diff {np.abs(got - alone).max()}"


@pytest.mark.parametrize("geom", sorted(GEOMETRIES))
def test_segments_change_only_the_rounding(geom):
    """The segmented walk is the same attention: the probe's output with segments of 512 keys agrees
    with the one-walk output to bf16 rounding."""
    one = probe_out("decode_alone", geom, torch.bfloat16)
    seg = probe_out("decode_alone", geom, torch.bfloat16, decode_only=True, split=512)
    np.testing.assert_allclose(seg, one, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("split", [0, 256])
@pytest.mark.parametrize("geom", sorted(GEOMETRIES))
def test_batch_invariant_outputs_match_the_cpu_op(geom, split):
    hq, hkv, d, bs, head_wise, swa = GEOMETRIES[geom]
    c = Case(((0, 5), (4, 1), (7, 9), (15, 2), (0, 1), (0, 0), (333, 40), (700, 1)), hq, hkv, d, d, True, bs,
             head_wise, swa, pad=3, seed=11)
    data = make_data(c)
    got = run_case(c, op.append_attention, torch.bfloat16, gpu(), data, batch_invariant=True, invariant_split=split)
    want = run_case(c, op.append_attention, torch.bfloat16, "cpu", data)
    assert not np.isnan(got[0]).any(), "NaN in the output: a masked or -1 slot was read"
    assert np.all(got[0][-3:] == 0), "padding tokens must come back as zeros"
    compare_outputs(got, want, 3e-2)
