"""The tensor-core prefill of the CUDA ``append_attention`` op (custom_ops/append_attention_prefill_tc.cuh:
bf16 / fp16, head_dim 64, 80, 96, 128) against the C++ op on random paged inputs
(tests/helpers/append_attention_cases.py), and the CUDA-core prefill on
the same data: group sizes 1, 2, 3, 4 and 8, head_dim 64, 80, 96 and 128, block sizes 16 and 64, chunks that
cross 128-row and 64-key tiles and block edges, cached prefixes, decode and zero-length rows beside
them, padding tokens, uniform and head-wise tables with NaN-poisoned -1 blocks, SWA heads in skip and
mask mode. Run on the GPU machine: ``python -m pytest -q -m gpu tests/kernels/test_append_attention_prefill_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.append_attention_cases import Case, compare_outputs, make_data, run_case
from paddle_mla.platform import runtime
from paddle_mla.ops import append_attention as op
from paddle_mla.platform.tensor_api import torch

pytestmark = pytest.mark.gpu

TOL = {"bfloat16": 3e-2, "float16": 4e-3}   # those of tests/kernels/test_append_attention_gpu.py
# (cached prefix, new tokens): long chunks (several 128-row tiles, 64-key tiles, causal diagonals off the
# tile edges), a cached prefix ending mid-block, decode rows and an empty row in the same step.
PF_REQS = ((0, 300), (500, 77), (40, 1), (0, 0), (63, 130), (17, 2), (64, 64), (0, 1))
PF_TABLES = [(16, False, (0, 0, 0)), (64, True, (1, 100, 4)), (16, True, (1, 40, 16)), (64, False, (1, 7, 0))]
PF_CASES = [(group, d, PF_TABLES[i % 4], "bfloat16")
            for i, (group, d) in enumerate((g, d) for g in (1, 2, 3, 4, 8) for d in (64, 80, 128))]
PF_CASES += [(4, 128, PF_TABLES[0], "float16"), (8, 64, PF_TABLES[1], "float16"), (3, 80, PF_TABLES[2], "float16"),
             (2, 128, PF_TABLES[3], "float16")]
PF_CASES += [(4, 96, PF_TABLES[1], "bfloat16"), (2, 96, PF_TABLES[3], "float16")]
# Which prefill runs: the tensor-core kernel, or the CUDA-core one on the same data.
PF_ENVS = {"tc": {}, "cudacore": {"PADDLE_MLA_GQA_PREFILL_TC": "0"}}
PF_RUNS = [(c, env) for c in PF_CASES for env in PF_ENVS]
_WANT: dict = {}


def _case(case) -> Case:
    group, d, table, _ = case
    bs, head_wise, swa = table
    return Case(PF_REQS, group * 2, 2, d, d, d % 32 == 0, bs, head_wise, swa, pad=3, seed=23 + group + d)


def _want(case, c, data):
    if case not in _WANT:   # the C++ op's answer, once per case for every kernel
        _WANT[case] = run_case(c, op.append_attention, getattr(torch, case[3]), "cpu", data)
    return _WANT[case]


@pytest.mark.parametrize("case,env", PF_RUNS,
                         ids=["g{}d{}-bs{}{}swa{}-{}-{}".format(c[0], c[1], c[2][0], "hw" if c[2][1] else "",
                                                                c[2][2][0], c[3], env) for c, env in PF_RUNS])
def test_tc_prefill_matches_cpu_op(case, env, monkeypatch):
    for name, value in PF_ENVS[env].items():
        monkeypatch.setenv(name, value)
    c = _case(case)
    data = make_data(c)
    got = run_case(c, op.append_attention, getattr(torch, case[3]), runtime.device_string("gpu"), data)
    assert not np.isnan(got[0]).any(), "NaN in the output: a masked or -1 slot was read"
    assert np.all(got[0][-3:] == 0), "padding tokens must come back as zeros"
    compare_outputs(got, _want(case, c, data), TOL[case[3]])


SWA_CASES = [c for c in PF_CASES if c[2][2][0]][:4]


@pytest.mark.parametrize("case", SWA_CASES, ids=lambda c: f"g{c[0]}d{c[1]}-bs{c[2][0]}{'hw' if c[2][1] else ''}")
def test_tc_prefill_swa_mask_mode(case):
    """swa_mask=True: the SWA heads walk every key j <= p and mask; same outputs as the C++ op."""
    c = _case(case)
    data = make_data(c)
    got = run_case(c, op.append_attention, getattr(torch, case[3]), runtime.device_string("gpu"), data,
                   swa_mask=True)
    assert not np.isnan(got[0]).any()
    compare_outputs(got, _want(case, c, data), TOL[case[3]])
