"""``deterministic: true`` for dsa: a sparse row's plan, and so its output bits, do not depend on
the batch. The split plan of the sparse MLA is the same for one row and for many (the default plan
is not, on a GPU's SM count), and a decode row's top-k positions (their order included) and its
sparse attention output are bitwise the same alone and in a batch of 48 rows. Interpreter on CPU,
or a GPU."""

import numpy as np
import pytest

from paddle_mla.platform import runtime
from paddle_mla.attention.backend import MLADims
from paddle_mla.platform.tensor_api import torch

pytestmark = pytest.mark.triton

DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")
DIMS = MLADims(num_heads=16, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32,
               softmax_scale=0.1)


def _backend(deterministic: bool):
    from paddle_mla.attention.dsa.backend import DSABackend

    return DSABackend(DIMS, max_num_seqs=64, max_model_len=512, block_size=16, device=DEV, dtype=torch.float32,
                      deterministic=deterministic)


@pytest.mark.parametrize("topk", [16, 2048])
def test_split_plan_is_the_same_alone_and_in_a_batch(topk, monkeypatch):
    from paddle_mla.attention.dsa import sparse_mla

    monkeypatch.setattr(sparse_mla, "num_sms", lambda *a: 132)      # an H100's SMs, also on a CPU
    det, default = _backend(True), _backend(False)
    alone = det.sparse_plan(1, topk)
    assert alone[0] == 1 and det.topk_segments == 1
    assert all(det.sparse_plan(rows, topk) == alone for rows in range(1, 65))
    if topk > 16:   # what the mode changes: by default the split count follows the row count
        assert len({default.sparse_plan(rows, topk)[0] for rows in range(1, 65)}) > 1


def test_decode_row_bits_are_the_same_alone_and_in_a_batch():
    from paddle_mla.attention.dsa.sparse_mla import sparse_mla
    from paddle_mla.attention.dsa.topk_select import topk_select

    rng = np.random.default_rng(3)
    det = _backend(True)
    rows, K, width, nb, page = 48, 64, 300, 24, 16
    scores = rng.standard_normal((rows, width)).astype(np.float32)
    scores[rng.random((rows, width)) < 0.6] = 0.0           # ties at the boundary too
    positions = rng.integers(K + 1, width, rows).astype(np.int64)
    cache = torch.from_numpy(rng.standard_normal((nb, page, 1, 48)).astype(np.float32)).to(DEV)
    q_lat = torch.from_numpy(rng.standard_normal((rows, 16, 32)).astype(np.float32)).to(DEV)
    q_pe = torch.from_numpy(rng.standard_normal((rows, 16, 16)).astype(np.float32)).to(DEV)

    def run(sel):
        n = len(sel)
        s = torch.from_numpy(np.ascontiguousarray(scores[sel])).to(DEV)
        bids = torch.zeros(n, dtype=torch.int32, device=DEV)
        pos = torch.from_numpy(positions[sel]).to(DEV)
        top = topk_select(s, K, torch.empty(n, K, dtype=torch.int64, device=DEV), bids, pos,
                          segments=det.topk_segments)
        slots = top % (nb * page)               # any fixed map from positions to cache slots
        part_o = torch.empty(1, dtype=torch.float32, device=DEV)
        out = torch.empty(n, 16, 32, dtype=torch.float32, device=DEV)
        o = sparse_mla(q_lat[sel], q_pe[sel], cache, slots, 0.1, part_o, part_o, out, det.sparse_cfg,
                       num_splits=det.forced_splits)
        return top.cpu().numpy(), o.cpu().numpy()

    batch_top, batch_out = run(np.arange(rows))
    for r in (0, 17, rows - 1):
        top, out = run(np.array([r]))
        np.testing.assert_array_equal(top[0], batch_top[r])       # the same positions, in the same order
        assert np.array_equal(out[0].view(np.int32), batch_out[r].view(np.int32))   # bitwise
