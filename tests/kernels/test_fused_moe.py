"""Routed MoE: the plain-tensor reference against the dense all-experts formula (both runtimes),
and the Triton fused MoE (align, grouped GEMMs, top-k sum) against the reference under
TRITON_INTERPRET=1 on CPU in float32/float16 at small dims (the GPU file covers bf16, FP8 and the
full M list at real dims: tests/kernels/test_fused_moe_gpu.py). FP8 is GPU-only: Triton 3.8's interpreter
rounds fp32 -> e4m3 without carrying into the exponent (127.9 -> 64, not 128), so the in-kernel
quantization of the intermediate cannot be checked here."""

import numpy as np
import pytest
from helpers.fused_moe_cases import PATTERNS, expert_weights, routing

from paddle_mla.platform import runtime
from paddle_mla.models.fused_moe.reference import routed_moe_reference
from paddle_mla.platform.tensor_api import F, torch

K, N, E, TOP_K = 80, 96, 8, 2       # K=80 leaves a K tail under BLOCK_K 32/64; N=96 an N tail under 64
DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")


def _t(a, dtype=None):
    x = torch.from_numpy(np.ascontiguousarray(a)).to(DEV)
    return x if dtype is None else x.to(dtype)


def _case(M, pattern="random", top_k=TOP_K, e=E, seed=0, dtype=None):
    rng = np.random.default_rng(seed)
    wg, wu, wd = (_t(w, dtype) for w in expert_weights(rng, e, N, K))
    x = _t(rng.standard_normal((M, K)).astype(np.float32), dtype)
    ids, w = routing(pattern, M, e, top_k, seed)
    return x, wg, wu, wd, _t(ids), _t(w)


def _dense(x, wg, wu, wd, ids, w):
    """Every expert over every token, weighted by a [T, E] combine matrix: the old formula."""
    combine = (F.one_hot(ids.to(torch.int64), wg.shape[0]).to(torch.float32) * w.unsqueeze(-1)).sum(1)
    xe = x.unsqueeze(0)
    h = F.silu(torch.matmul(xe, wg.transpose(1, 2))) * torch.matmul(xe, wu.transpose(1, 2))
    y = torch.matmul(h, wd.transpose(1, 2))
    return (y.to(torch.float32) * combine.transpose(0, 1).unsqueeze(-1)).sum(0).to(x.dtype)


@pytest.mark.parametrize("pattern", ["random", "two_full_rest_empty", "one_token_per_expert_skew"])
@pytest.mark.parametrize("M", [1, 83])
def test_reference_matches_dense_formula(M, pattern):
    x, wg, wu, wd, ids, w = _case(M, pattern)
    got = routed_moe_reference(x, wg, wu, wd, ids, w)
    np.testing.assert_allclose(got.cpu().numpy(), _dense(x, wg, wu, wd, ids, w).cpu().numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.triton
class TestFusedKernels:
    @staticmethod
    def _run(x, wg, wu, wd, ids, w, config=None, chunk=8192):
        from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe

        ws = MoEWorkspace(x.shape[0], ids.shape[1], wg.shape[0], N, K, x.dtype, DEV, chunk_tokens=chunk)
        return fused_moe(x, wg, wu, wd, ids, w, ws, config=config)

    @pytest.mark.parametrize("block_m", [16, 64])
    @pytest.mark.parametrize("pattern", ["random", "two_full_rest_empty", "one_token_per_expert_skew"])
    @pytest.mark.parametrize("M,e,top_k", [(83, E, TOP_K), (200, 160, 4), (700, 20, 3)])   # 160: many label programs
    @pytest.mark.parametrize("one_program", [True, False])
    @pytest.mark.parametrize("held", ["all", "middle"])
    def test_align(self, pattern, block_m, M, e, top_k, one_program, held):
        """Both forms: one program (here for every size; 2100 pairs loop over its chunks) and the wide one.
        ``middle``: the rank holds experts [2, e - 2) (expert parallel): ids shifted by 2, the pairs of
        other ranks' experts (negative or past the rank's count) take no slot."""
        from paddle_mla.models.fused_moe.align import AlignBuffers, moe_align

        lo, E = (0, e) if held == "all" else (2, e - 4)
        ids = _t(routing(pattern, M, e, top_k, seed=M)[0] - lo)
        TOP_K = top_k
        buf = AlignBuffers(M * TOP_K, E, DEV)
        buf.sorted_ids.fill_(-7)                # stale values from an earlier call must not survive
        buf.expert_ids.fill_(-7)
        sorted_ids, expert_ids, total = moe_align(ids, buf, block_m, one_program=one_program)
        s, ex, tot = sorted_ids.cpu().numpy(), expert_ids.cpu().numpy(), int(total.cpu().numpy()[0])
        flat = ids.cpu().numpy().reshape(-1)
        mine = (flat >= 0) & (flat < E)
        counts = np.bincount(flat[mine], minlength=E)
        assert tot == int(sum(-(-c // block_m) * block_m for c in counts))
        valid = s[:tot][s[:tot] < M * TOP_K]
        assert sorted(valid.tolist()) == np.flatnonzero(mine).tolist(), "every held pair exactly once"
        assert (s[tot:] == M * TOP_K).all() and (ex[-(-tot // block_m):] == -1).all()
        for b in range(tot // block_m):
            rows = s[b * block_m:(b + 1) * block_m]
            rows = rows[rows < M * TOP_K]
            assert len(rows) > 0, "no all-padding block inside the padded total"
            assert (flat[rows] == ex[b]).all(), f"block {b} mixes experts"

    @pytest.mark.parametrize("pattern", ["random", "two_full_rest_empty", "one_token_per_expert_skew"])
    @pytest.mark.parametrize("M", [1, 83, 128, 300])
    def test_fused_matches_reference_fp32(self, M, pattern):
        case = _case(M, pattern, seed=M)
        got = self._run(*case)
        ref = routed_moe_reference(*case)
        np.testing.assert_allclose(got.cpu().numpy(), ref.cpu().numpy(), atol=2e-4, rtol=2e-4)

    def test_every_expert_full(self):
        case = _case(40, "all_full", top_k=4, e=4)
        np.testing.assert_allclose(self._run(*case).cpu().numpy(), routed_moe_reference(*case).cpu().numpy(),
                                   atol=2e-4, rtol=2e-4)

    @pytest.mark.parametrize("cfg", [
        dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2),
        dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_M=4, num_warps=4, num_stages=2),
        dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=2)])
    def test_launch_configs_and_chunks(self, cfg):
        """N and K tails, grouped tile order, and token chunks smaller than M (workspace of 50 tokens)."""
        case = _case(131, "random", seed=7)
        got = self._run(*case, config=cfg, chunk=50)
        np.testing.assert_allclose(got.cpu().numpy(), routed_moe_reference(*case).cpu().numpy(), atol=2e-4, rtol=2e-4)

    def test_fp16(self):
        case = _case(83, "random", seed=3, dtype=torch.float16)
        got = self._run(*case).to(torch.float32)
        ref = routed_moe_reference(*[t.to(torch.float32) if t.dtype == torch.float16 else t for t in case])
        np.testing.assert_allclose(got.cpu().numpy(), ref.cpu().numpy(), atol=2e-2, rtol=2e-2)

    @pytest.mark.parametrize("M", [1, 83])
    def test_expert_parallel_slices_sum_to_the_whole(self, M):
        """A rank holding experts [lo, hi) gets ids shifted by lo: the others fall outside its rows
        (negative or past them) and add nothing, in the align, the single-token path and the top-k
        sum; the ranks' outputs add up to the whole layer's, as the block's all-reduce adds them."""
        from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe

        x, wg, wu, wd, ids, w = _case(M, "random", seed=11 + M)
        whole = self._run(x, wg, wu, wd, ids, w).cpu().numpy()
        total = np.zeros_like(whole)
        for lo, hi in [(0, 3), (3, 5), (5, E)]:
            ws = MoEWorkspace(M, TOP_K, hi - lo, N, K, x.dtype, DEV)
            shifted = (ids - lo).contiguous()
            part = fused_moe(x, wg[lo:hi].contiguous(), wu[lo:hi].contiguous(), wd[lo:hi].contiguous(), shifted, w,
                             ws, n_routed=E).cpu().numpy()
            ref = routed_moe_reference(x, wg[lo:hi], wu[lo:hi], wd[lo:hi], shifted, w).cpu().numpy()
            np.testing.assert_allclose(part, ref, atol=2e-4, rtol=2e-4)
            total += part
        np.testing.assert_allclose(total, whole, atol=4e-4, rtol=4e-4)

    def test_layer_picks_triton_and_matches_reference(self, monkeypatch):
        """The MoE layer (routing included) with PADDLE_MLA_MOE=triton vs =reference."""
        from paddle_mla.models.moe import MoEExec

        case = _case(83, "random", seed=5)
        outs = {}
        for impl in ("triton", "reference"):
            monkeypatch.setenv("PADDLE_MLA_MOE", impl)
            ex = MoEExec(DEV, torch.float32)
            assert ex.impl == impl
            outs[impl] = ex.run(*case).cpu().numpy()
        np.testing.assert_allclose(outs["triton"], outs["reference"], atol=2e-4, rtol=2e-4)


def test_launch_config_reads_json_nearest_m(tmp_path, monkeypatch):
    import json

    from paddle_mla.models.fused_moe import launch_config as lc

    cfg = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, GROUP_M=4, num_warps=4, num_stages=3)
    table = {"1": dict(cfg, BLOCK_M=16), "256": cfg}
    (tmp_path / lc.config_file_name(8, 96, 80, "bf16", "Fake GPU")).write_text(json.dumps(table))
    monkeypatch.setattr(lc, "CONFIG_DIR", tmp_path)
    lc.load_configs.cache_clear()
    try:
        assert lc.get_config(3, 8, 96, 80, 2, "bf16", "Fake GPU")["BLOCK_M"] == 16
        assert lc.get_config(200, 8, 96, 80, 2, "bf16", "Fake GPU") == cfg
        assert lc.get_config(200, 8, 96, 80, 2, "bf16", "Other GPU") == lc.default_config(200, 8, 2, "bf16")
    finally:
        lc.load_configs.cache_clear()


def test_batch_invariant_config_follows_m_only_on_wgmma_tiles():
    """``deterministic: true``: bf16 M whose config runs on wgmma (BLOCK_M >= 64, whole warpgroups)
    keep it; smaller-tile M and every fp8 M take the one mode config."""
    from paddle_mla.models.fused_moe import launch_config as lc

    E, N, K, top_k = 64, 1408, 2048, 6
    small = lc.get_config(16, E, N, K, top_k, "bf16", "Other GPU", batch_invariant=True)
    assert lc.default_config(16, E, top_k, "bf16")["BLOCK_M"] < 64 and small == lc.batch_invariant_config("bf16")
    big = lc.get_config(8192, E, N, K, top_k, "bf16", "Other GPU", batch_invariant=True)
    assert big == lc.default_config(8192, E, top_k, "bf16") and big["BLOCK_M"] >= 64 and big["num_warps"] % 4 == 0
    for m in (1, 8192):
        assert lc.get_config(m, E, N, K, top_k, "fp8_w8a8", "Other GPU", batch_invariant=True) == \
            lc.batch_invariant_config("fp8_w8a8")


@pytest.mark.skipif(runtime.is_paddle(), reason="the benchmark selects the torch runtime (CUDA graphs)")
def test_align_picks_one_program_for_decode_sized_calls():
    """The bound the H200 figures set (align.py's docstring): V2-Lite's 66 columns up to 1024 pairs
    (128 tokens), V3's 257 up to 256 pairs (28 tokens)."""
    from paddle_mla.models.fused_moe.align import picks_one_program

    assert picks_one_program(1024, 66) and not picks_one_program(1032, 66)
    assert picks_one_program(256, 257) and not picks_one_program(264, 257)


@pytest.mark.skipif(runtime.is_paddle(), reason="the benchmark selects the torch runtime (CUDA graphs)")
def test_align_benchmark_smoke_compares_both_forms():
    """The program behind BENCHMARKS.md's align figures, on CPU: both forms give the same plan."""
    from benchmarks.kernels.moe_align import main

    rows = main(["--smoke"])
    assert [(r["tokens"], r["pairs"], r["picked"]) for r in rows] == [(3, 12, "one"), (40, 160, "one")]
    assert all(r["same"] for r in rows)
