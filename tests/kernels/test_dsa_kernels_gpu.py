"""DSA Triton kernels on the GPU, bf16 at V3.2 shapes (index heads 64 x 128, latent 512 + 64, top-k
2048) vs the plain references, block sizes 16 and 64; all-invalid rows give zeros. Run by
scripts/gpu_check.sh; skipped in CPU CI. No transformers needed."""

import numpy as np
import pytest
from helpers.triton_kernel_helpers import random_block_tables

from paddle_mla.platform import runtime
from paddle_mla.attention.dsa import reference as ref
from paddle_mla.attention.dsa.key_window import KeyWindows
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch
from paddle_mla.attention.native import gather_latent
from paddle_mla.platform.tensor_api import torch

pytestmark = [pytest.mark.gpu, pytest.mark.triton]
DEV = runtime.device_string("gpu")


def _meta(rng, num_new, num_cached, page):
    num_new, num_cached = np.array(num_new, np.int32), np.array(num_cached, np.int32)
    tables, nb = random_block_tables(rng, num_new + num_cached, page)
    batch = StepBatch(token_ids=np.zeros(int(num_new.sum()), np.int64), num_new=num_new, num_cached=num_cached,
                      block_tables=tables, is_prefill=num_new > 1, sample_mask=np.ones(len(num_new), bool))
    return ForwardMeta.build(batch, page, DEV, KeyWindows(int(num_new.sum()) + 1, DEV)), nb


@pytest.mark.parametrize("variant", [dict(), dict(append_sem="acq_rel", short_select=False, threshold_digits=3)],
                         ids=["default", "previous"])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("lens", [([300, 1, 1], [0, 5000, 2047]), ([1] * 8, [4096, 1, 2048, 2049, 17, 3000, 64, 9])],
                         ids=["mixed", "decode"])
def test_index_scores_and_topk_bf16(page, lens, variant):
    from paddle_mla.attention.dsa.index_kernels import index_scores
    from paddle_mla.attention.dsa.topk_select import topk_select

    rng = np.random.default_rng(page)
    meta, nb = _meta(rng, *lens, page)
    T, H, D, K = meta.num_tokens, 64, 128, 2048
    cache = torch.randn(nb, page, 1, D, device=DEV).to(torch.bfloat16)
    q = torch.randn(T, H, D, device=DEV).to(torch.bfloat16)
    w = torch.randn(T, H, device=DEV) * 0.1
    width = meta.max_seqlen_k
    out = torch.empty(T, width, dtype=torch.float32, device=DEV)
    win = {} if meta.is_decode_only else dict(ks=meta.index_ks, ke=meta.index_ke, cu_seqlens_k=meta.cu_seqlens_k)
    got = index_scores(q, w, cache, meta.block_tables, meta.batch_id_per_token, meta.positions, width, out, **win)
    pos = topk_select(got, K, torch.empty(T, K, dtype=torch.int64, device=DEV), meta.batch_id_per_token,
                      meta.positions, **win, **variant)
    s = 0
    for b in range(meta.num_reqs):
        n, c = int(meta.seq_lens_q[b]), int(meta.num_cached[b])
        keys = gather_latent(cache, meta.block_tables[b], n + c, page)
        exp = ref.masked_scores_ref(ref.index_scores_ref(q[s:s + n], w[s:s + n], keys),
                                    torch.zeros(n, dtype=torch.int64, device=DEV),
                                    torch.arange(n, dtype=torch.int64, device=DEV) + c + 1)
        g_b = got[s:s + n, :n + c]
        fin = torch.isfinite(exp)      # each row's causal window (the kernel writes nothing else)
        assert float((g_b[fin] - exp[fin]).abs().max()) < 2e-2 * float(exp[fin].abs().max())
        # selection: rows with <= K keys select exactly their causal keys; others are exactly the K
        # largest of the kernel's own scores (by value, so ties may pick either), and overlap the reference
        for i in (0, n - 1):
            row = pos[s + i].cpu().numpy()
            sel = set(row.tolist()) - {-1}
            want = set(ref.topk_ref(exp[i:i + 1], K)[0].cpu().numpy().tolist()) - {-1}
            if c + i + 1 <= K:
                assert sel == set(range(c + i + 1))
            else:
                window = g_b[i, :c + i + 1].cpu().numpy()
                np.testing.assert_array_equal(np.sort(window[row]), np.sort(window)[-K:])
                assert len(sel & want) >= 0.97 * K
        s += n


@pytest.mark.parametrize("topk", [64, 2048])
def test_sparse_mla_bf16(topk):
    from paddle_mla.attention.dsa.sparse_mla import sparse_mla, sparse_mla_ref

    T, H, C, R, nb, page = 64, 128, 512, 64, 600, 64
    cache = torch.randn(nb, page, 1, C + R, device=DEV).to(torch.bfloat16)
    slots = torch.randint(0, nb * page, (T, topk), device=DEV)
    slots[1, topk // 3:] = -1
    slots[2] = -1
    q_lat = (torch.randn(T, H, C, device=DEV) * 0.05).to(torch.bfloat16)
    q_pe = (torch.randn(T, H, R, device=DEV) * 0.05).to(torch.bfloat16)
    part_o = torch.empty(T, H, 8, C, dtype=torch.float32, device=DEV)
    part_lse = torch.empty(T, H, 8, dtype=torch.float32, device=DEV)
    out = torch.full((T, H, C), float("nan"), device=DEV).to(torch.bfloat16)
    got = sparse_mla(q_lat, q_pe, cache, slots, 0.1, part_o, part_lse, out).float()
    exp = sparse_mla_ref(q_lat, q_pe, cache, slots, 0.1)
    assert not torch.isnan(got).any() and float(got[2].abs().max()) == 0.0
    assert float((got - exp).abs().max()) < 3e-2
