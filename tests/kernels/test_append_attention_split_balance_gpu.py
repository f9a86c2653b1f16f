"""Decode split plans, by each (row, KV head)'s own length (the default, decode_split_keys: one split
size for the launch, no shorter than split_floor_keys) and equal (PADDLE_MLA_GQA_SPLITS=equal): full
and SWA heads mixed in one launch, ragged rows (a few tokens beside 8k), one long row alone (the
most splits a row may take), a workspace that holds fewer splits, and a CUDA graph replayed with new
lengths (the split size by length is computed on the device from the step's positions). Every decode
kernel against the plain-tensor reference (fp32 on the GPU), with SWA rows' out-of-window blocks -1 and NaN-poisoned.
Run on the GPU machine: ``python -m pytest -q -m gpu tests/kernels/test_append_attention_split_balance_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.append_attention_cases import Case, check_decode_graph_replay, compare_outputs, gpu, make_data, run_case
from paddle_mla.attention.gqa_reference import append_attention_reference
from paddle_mla.ops import append_attention as op
from paddle_mla.platform.tensor_api import torch

pytestmark = pytest.mark.gpu

TOL = {"float32": 2e-4, "bfloat16": 3e-2}
RAGGED = ((4095, 1), (31, 1), (2047, 1), (8191, 1), (0, 0), (100, 1), (6000, 1), (0, 1))
ONE_LONG = ((8191, 1),)
# (block size, head-wise tables, (SWA heads, window, sink)) at ERNIE-4.5's 20 query / 4 KV heads
SWA_TABLES = [(64, True, (2, 512, 64)), (16, True, (3, 256, 16)), (64, True, (4, 1000, 0)), (64, False, (2, 300, 64))]
# The decode split plan: by each row's length (the default), or equal splits.
PLANS = {"length": None, "equal": "equal"}
# Which decode kernel runs (bf16): the register-O tensor-core one, the WMMA one, the CUDA-core one.
KERNELS = {"mma": {}, "wmma": {"PADDLE_MLA_GQA_TC_KERNEL": "wmma"}, "cudacore": {"PADDLE_MLA_GQA_TC": "0"}}


@pytest.fixture(params=sorted(PLANS))
def plan(request, monkeypatch):
    """The decode split plan under test (custom_ops/append_attention_kernels.cu, decode_plan)."""
    if PLANS[request.param]:
        monkeypatch.setenv("PADDLE_MLA_GQA_SPLITS", PLANS[request.param])
    else:
        monkeypatch.delenv("PADDLE_MLA_GQA_SPLITS", raising=False)
    return request.param


def bf16_exact(data):
    """Inputs rounded to bf16 once, so the bf16 op and the fp32 reference see the same values."""
    r = lambda xs: [torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy() for x in xs]  # noqa: E731
    data.Q, data.K, data.V = r(data.Q), r(data.K), r(data.V)
    return data


def check(got, want, tol):
    assert not np.isnan(got[0]).any(), "NaN in the output: a masked or -1 slot was read"
    compare_outputs(got, want, tol)


@pytest.mark.parametrize("reqs", [RAGGED, ONE_LONG], ids=["ragged", "one_long"])
@pytest.mark.parametrize("table", SWA_TABLES, ids=lambda t: f"bs{t[0]}{'hw' if t[1] else ''}swa{t[2][0]}")
def test_fp32_decode_matches_reference(table, reqs, plan):
    bs, head_wise, swa = table
    c = Case(reqs, 20, 4, 128, 128, True, bs, head_wise, swa, pad=2, seed=23)
    data = make_data(c)
    got = run_case(c, op.append_attention, torch.float32, gpu(), data, decode_only=True)
    check(got, run_case(c, append_attention_reference, torch.float32, gpu(), data), TOL["float32"])


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("table", SWA_TABLES[:3], ids=lambda t: f"bs{t[0]}swa{t[2][0]}")
def test_bf16_decode_kernels_match_reference(table, kernel, plan, monkeypatch):
    for name, value in KERNELS[kernel].items():
        monkeypatch.setenv(name, value)
    bs, head_wise, swa = table
    c = Case(RAGGED, 20, 4, 128, 128, True, bs, head_wise, swa, pad=2, seed=29)
    data = bf16_exact(make_data(c))
    got = run_case(c, op.append_attention, torch.bfloat16, gpu(), data, decode_only=True)
    want = run_case(c, append_attention_reference, torch.float32, gpu(), data)
    check(got, want, TOL["bfloat16"])


@pytest.mark.parametrize("ws_seqs", [1, 8])
def test_small_workspace_caps_the_splits(ws_seqs, monkeypatch):
    """One long row may take up to 128 splits by length; a workspace for one row of 16 splits holds fewer: the
    split size grows so the row still fits, and the result is the same."""
    monkeypatch.delenv("PADDLE_MLA_GQA_SPLITS", raising=False)   # by length
    c = Case(ONE_LONG + ((3000, 1),), 20, 4, 128, 128, True, 64, True, (2, 512, 64), seed=31)
    data = bf16_exact(make_data(c))
    ws = torch.empty(op.workspace_numel(ws_seqs, 20, 128), dtype=torch.float32, device=gpu())
    got = run_case(c, op.append_attention, torch.bfloat16, gpu(), data, workspace=ws, decode_only=True)
    check(got, run_case(c, append_attention_reference, torch.float32, gpu(), data), TOL["bfloat16"])


def test_head_wise_swa_decode_replays_in_a_cuda_graph(monkeypatch):
    """Captured once at short lengths; replayed with ragged ones (one row 60x the others), mixed
    full and SWA heads: the split size by length follows the replayed positions (it is computed on
    the device) and matches an eager call."""
    monkeypatch.delenv("PADDLE_MLA_GQA_SPLITS", raising=False)   # by length
    check_decode_graph_replay(gpu(), 6, 20, 4, 128, 64, 80,
                              ([1, 17, 5000, 100, 64, 2], [5120, 5119, 700, 33, 4096, 513]),
                              head_wise=True, seed=1, num_swa_heads=2, window=512, sink=64)
