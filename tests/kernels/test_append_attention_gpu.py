"""The CUDA ``append_attention`` op against the C++ op (CPU, same dtype) and the plain-tensor
reference, on random paged inputs (tests/helpers/append_attention_cases.py): block sizes 16 and 64, contexts
crossing block edges, zero-length rows and padding tokens, bf16 / fp16 / fp32, uniform and head-wise
tables with -1 (NaN-poisoned) slots and SWA heads, decode splits, and CUDA-graph replay.
Run on the GPU machine: ``python -m pytest -q -m gpu tests/kernels/test_append_attention_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.append_attention_cases import Case, check_decode_graph_replay, compare_outputs, gpu, make_data, run_case
from paddle_mla.attention.gqa_reference import append_attention_reference
from paddle_mla.ops import append_attention as op
from paddle_mla.platform.tensor_api import torch

pytestmark = pytest.mark.gpu

TOL = {"float32": 2e-4, "bfloat16": 3e-2, "float16": 4e-3}
REQS = {
    "mixed": ((0, 5), (4, 1), (7, 9), (15, 2), (0, 1), (0, 0), (33, 40)),
    "edges": ((15, 1), (16, 1), (63, 1), (64, 1), (0, 0), (127, 2), (0, 65)),
    "decode": ((15, 1), (16, 1), (63, 1), (64, 1), (1000, 1), (3071, 1), (200, 1)),
    "long_prefill": ((0, 300), (500, 77)),
}
TABLES = [(16, False, (0, 0, 0)), (64, False, (0, 0, 0)), (16, True, (0, 0, 0)), (16, True, (1, 40, 16)),
          (64, True, (2, 100, 4)), (16, False, (1, 7, 0))]


SHAPES = [(32, 8, 128, 128, True), (12, 4, 80, 64, False), (6, 2, 24, 24, True)]
# The production shape (h32x8, d128) in bf16 only: its CPU side dominates the time (about 8 s a case);
# every dtype runs on the two smaller shapes, which exercise the same kernels' other template paths.
CASES = [(shape, table, reqs, dtype) for shape in SHAPES for table in TABLES for reqs in sorted(REQS)
         for dtype in sorted(TOL) if shape is not SHAPES[0] or dtype == "bfloat16"]


@pytest.mark.parametrize("shape,table,reqs,dtype", CASES,
                         ids=["h{}x{}d{}-bs{}{}swa{}-{}-{}".format(*c[0][:3], c[1][0], "hw" if c[1][1] else "",
                                                                    c[1][2][0], c[2], c[3]) for c in CASES])
def test_cuda_op_matches_cpu_op(dtype, reqs, table, shape):
    hq, hkv, d, rot, neox = shape
    bs, head_wise, swa = table
    c = Case(REQS[reqs], hq, hkv, d, rot, neox, bs, head_wise, (min(swa[0], hkv), swa[1], swa[2]), pad=3, seed=11)
    data = make_data(c)
    dt = getattr(torch, dtype)
    got = run_case(c, op.append_attention, dt, gpu(), data)
    assert not np.isnan(got[0]).any(), "NaN in the output: a masked or -1 slot was read"
    assert np.all(got[0][-3:] == 0), "padding tokens must come back as zeros"
    want = run_case(c, op.append_attention, dt, "cpu", data)
    compare_outputs(got, want, TOL[dtype])


@pytest.mark.parametrize("table", TABLES[:4], ids=lambda t: f"bs{t[0]}{'hw' if t[1] else ''}swa{t[2][0]}")
def test_cuda_op_matches_reference_fp32(table):
    bs, head_wise, swa = table
    c = Case(REQS["mixed"], 6, 2, 40, 32, False, bs, head_wise, swa, pad=1, seed=5)
    data = make_data(c)
    got = run_case(c, op.append_attention, torch.float32, gpu(), data)
    want = run_case(c, append_attention_reference, torch.float32, gpu(), data)
    compare_outputs(got, want, 2e-4)


@pytest.mark.parametrize("ws_seqs", [0, 1, 64])
def test_decode_splits_and_workspace(ws_seqs):
    """A small workspace lowers the number of splits (one split: no workspace at all); results agree."""
    c = Case(REQS["decode"], 32, 8, 128, 128, True, 16, seed=3)
    data = make_data(c)
    ws = torch.empty(op.workspace_numel(ws_seqs, 32, 128) if ws_seqs else 0, dtype=torch.float32, device=gpu())
    got = run_case(c, op.append_attention, torch.bfloat16, gpu(), data, workspace=ws, decode_only=True)
    want = run_case(c, op.append_attention, torch.bfloat16, "cpu", data)
    compare_outputs(got, want, TOL["bfloat16"])


def test_graph_padding_rows_touch_nothing():
    """CUDA-graph padding: one token per padded row, seq_lens_k 0 and a stale table row. Nothing is
    written into the blocks the stale row names, and the padded outputs are zeros."""
    dev, hq, hkv, d, bs = gpu(), 8, 2, 64, 16
    kc = torch.randn(hkv, 8, bs, d, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    k0, v0 = kc.clone(), vc.clone()
    tables = torch.tensor([[0, 1], [2, 3], [2, 3]], dtype=torch.int32, device=dev)   # rows 1, 2: padding
    lens = torch.tensor([20, 0, 0], dtype=torch.int32, device=dev)
    cu = torch.arange(4, dtype=torch.int32, device=dev)
    ids = torch.arange(3, dtype=torch.int32, device=dev)
    pos = torch.tensor([19, 0, 0], dtype=torch.int64, device=dev)
    q = torch.randn(3, hq, d, device=dev, dtype=torch.bfloat16)
    k, v = torch.randn(3, hkv, d, device=dev, dtype=torch.bfloat16), torch.randn(3, hkv, d, device=dev,
                                                                                  dtype=torch.bfloat16)
    cs = torch.randn(64, d, device=dev)
    out = torch.full_like(q, float("nan"))
    ws = torch.empty(op.workspace_numel(3, hq, d), dtype=torch.float32, device=dev)
    op.append_attention(q, k, v, kc, vc, tables, cu, lens, ids, pos, cs, out, softmax_scale=0.125, neox=True,
                        rot_dim=d, workspace=ws, decode_only=True)
    assert torch.equal(kc[:, 2:4], k0[:, 2:4]) and torch.equal(vc[:, 2:4], v0[:, 2:4])
    assert torch.all(out[1:] == 0) and not torch.isnan(out[0]).any()


def test_decode_replays_in_a_cuda_graph():
    """Captured once; replayed with new lengths, tables and tokens it matches an eager call."""
    check_decode_graph_replay(gpu(), 8, 16, 4, 128, 16, 64,
                              ([1, 17, 33, 100, 512, 1023, 5, 64], [900, 2, 3, 16, 15, 1024, 300, 77]))


# Tensor-core decode (bf16/fp16, head_dim % 16 == 0, group <= 16; both kernels, see TC_ENVS) over
# every group size it serves, head_dim 64 and 128, contexts off the 64-key tile (and block) edges, 1-3
# splits, padding rows, uniform and head-wise tables with SWA heads (NaN-poisoned -1 blocks). Prefixes
# stay short so that the C++ op's prefill of them (the reference side) costs well under a second a case.
TC_REQS = ((15, 1), (16, 1), (63, 1), (64, 1), (0, 0), (200, 1), (519, 1), (1, 1), (0, 1))
TC_TABLES = [(16, False, (0, 0, 0)), (64, True, (1, 100, 4)), (16, True, (1, 40, 16))]
TC_CASES = [(group, d, table, "bfloat16") for group in (1, 2, 4, 8, 16) for d in (64, 128) for table in TC_TABLES]
TC_CASES += [(8, 128, TC_TABLES[1], "float16"), (16, 64, TC_TABLES[2], "float16"), (3, 80, TC_TABLES[0], "float16")]
# Which kernel runs: the default tensor-core one (register-O mma.sync, append_attention_decode_mma.cuh,
# for head_dim <= 128), its 3-stage head_dim-128 variant, the WMMA kernel (append_attention_decode_tc.cuh)
# and its 32-key head_dim-128 tile, the CUDA-core one.
TC_ENVS = {"tc": {}, "mma3": {"PADDLE_MLA_GQA_TC_STAGES": "3"}, "wmma": {"PADDLE_MLA_GQA_TC_KERNEL": "wmma"},
           "tc32": {"PADDLE_MLA_GQA_TC_TILE": "32"}, "cudacore": {"PADDLE_MLA_GQA_TC": "0"}}
_TC_WANT: dict = {}
TC_RUNS = [(c, env) for c in TC_CASES for env in TC_ENVS if env not in ("tc32", "mma3") or c[1] == 128]


@pytest.mark.parametrize("case,env", TC_RUNS,
                         ids=["g{}d{}-bs{}{}swa{}-{}-{}".format(c[0], c[1], c[2][0], "hw" if c[2][1] else "",
                                                                c[2][2][0], c[3], env) for c, env in TC_RUNS])
def test_tc_decode_matches_cpu_op(case, env, monkeypatch):
    """Every decode kernel (and variant) against the C++ op."""
    for name, value in TC_ENVS[env].items():
        monkeypatch.setenv(name, value)
    group, d, table, dtype = case
    bs, head_wise, swa = table
    hkv = 2
    c = Case(TC_REQS, group * hkv, hkv, d, d, True, bs, head_wise, swa, pad=2, seed=17)
    data = make_data(c)
    dt = getattr(torch, dtype)
    got = run_case(c, op.append_attention, dt, gpu(), data)
    assert not np.isnan(got[0]).any(), "NaN in the output: a masked or -1 slot was read"
    assert np.all(got[0][-2:] == 0), "padding tokens must come back as zeros"
    if case not in _TC_WANT:   # the C++ op's answer, once per case for the three kernels
        _TC_WANT[case] = run_case(c, op.append_attention, dt, "cpu", data)
    compare_outputs(got, _TC_WANT[case], TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])   # bf16 decode rows take the tensor-core kernel
@pytest.mark.parametrize("reqs", ["mixed", "decode", "long_prefill"])
@pytest.mark.parametrize("table", [t for t in TABLES if t[2][0]],
                         ids=lambda t: f"bs{t[0]}{'hw' if t[1] else ''}swa{t[2][0]}")
def test_cuda_swa_mask_mode_matches_skip_mode(table, reqs, dtype):
    """swa_mask=True (the decode and prefill kernels walk every key j <= p of an SWA head and mask it
    in attend_tile) against the default skip mode on the GPU and the C++ op's mask mode on CPU.
    Tile boundaries differ between the modes, so fp32 agrees to rounding, not bit for bit."""
    bs, head_wise, swa = table
    c = Case(REQS[reqs], 12, 4, 80, 64, False, bs, head_wise, swa, pad=3, seed=13)
    data = make_data(c)
    dt = getattr(torch, dtype)
    mask = run_case(c, op.append_attention, dt, gpu(), data, swa_mask=True)
    assert not np.isnan(mask[0]).any(), "NaN in the output: a masked or -1 slot was read"
    skip = run_case(c, op.append_attention, dt, gpu(), data)
    compare_outputs(mask, skip, TOL[dtype])
    compare_outputs(mask, run_case(c, op.append_attention, dt, "cpu", data, swa_mask=True), TOL[dtype])


@pytest.mark.parametrize("reqs", ["mixed", "decode", "long_prefill"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_flat_cache_with_per_head_ranges(dtype, reqs):
    """Per-head ranges of one flat [total, bs, D] cache (global ids, unequal gaps) on the GPU: the same
    outputs and per-head cache contents as the head-major layout."""
    c = Case(REQS[reqs], 12, 4, 80, 64, False, 16, True, (2, 40, 16), pad=3, seed=17)
    data = make_data(c)
    dt = getattr(torch, dtype)
    bases = [3, 3 + data.num_blocks, 7 + 2 * data.num_blocks, 7 + 3 * data.num_blocks + 1]
    got = run_case(c, op.append_attention, dt, gpu(), data, flat_bases=bases)
    assert not np.isnan(got[0]).any()
    compare_outputs(got, run_case(c, op.append_attention, dt, gpu(), data), TOL[dtype])
