"""``deterministic: true`` on the GPU in bf16: one row's output bits alone equal its bits at several
positions of batches of several sizes, for each piece whose launch would otherwise follow the batch:
the batch-invariant GEMM (and its tiles and loads agreeing bit for bit), the triton_mla decode with
the fixed-split plan, the fused MoE (bf16 and FP8), the FP8 linear and the RMSNorm of a strided view
(MLA's latent) under the mode. Each but the fused MoE also matches its plain-tensor reference to bf16
rounding here; the MoE's outputs are checked finite (tests/kernels/test_fused_moe_gpu.py holds its
reference checks). Run by scripts/gpu_tests.sh; skipped on CPU."""

import numpy as np
import pytest
from helpers.fused_moe_cases import expert_weights, routing
from helpers.triton_kernel_helpers import kernel_namespace, random_block_tables

from paddle_mla.platform import runtime
from paddle_mla.platform.tensor_api import torch

pytestmark = [pytest.mark.gpu, pytest.mark.triton]
DEV = runtime.device_string("gpu")
SIZES = (2, 7, 64, 200)


@pytest.fixture
def mode():
    from paddle_mla.ops import batch_invariant

    batch_invariant.set_enabled(True)
    yield batch_invariant
    batch_invariant.set_enabled(False)


def _batches(n_rows: int, probe: int):
    """(row order, position of ``probe``) for batches of SIZES rows, the probe first, mid and last."""
    others = [j for j in range(n_rows) if j != probe]
    for size in SIZES:
        for pos in (0, size // 2, size - 1):
            rows = others[:size - 1]
            yield rows[:pos] + [probe] + rows[pos:], pos


def _assert_row_invariant(fn, x, probe=3):
    alone = fn(x[probe:probe + 1])
    for order, pos in _batches(x.shape[0], probe):
        got = fn(x[torch.tensor(order, device=DEV)])
        assert torch.equal(got[pos], alone[0]), f"batch of {len(order)}, row at {pos}"
    return alone


@pytest.mark.parametrize("K,N", [(2048, 3072), (2048, 102400), (10944, 2048)])
def test_linear_bf16_row_invariant(mode, K, N):
    g = torch.Generator(device=DEV).manual_seed(K)
    x = torch.randn(256, K, device=DEV, generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, device=DEV, generator=g) * K ** -0.5).to(torch.bfloat16)
    alone = _assert_row_invariant(lambda t: mode.linear(t, w), x)
    ref = x[3:4].float() @ w.float().T
    assert float((alone.float() - ref).abs().max()) < 0.05 * float(ref.abs().max())


@pytest.mark.parametrize("K,N", [(4096, 1024), (2048, 3072), (12288, 4096), (4096, 151936), (2048, 576)])
def test_gemm_tiles_and_loads_give_the_same_bits(K, N):
    """tile_for's two tiles, each through TMA and pointer loads, and the swapped kernel's tiles give one
    row the same bits: the property that lets the mode's kernel and tile follow the launch
    (ops/batch_invariant_kernels.py). The row counts cross both switches, so gemm_nt itself takes
    every kernel here."""
    from paddle_mla.ops import batch_invariant_kernels as bik

    g = torch.Generator(device=DEV).manual_seed(N)
    x = torch.randn(4096, K, device=DEV, generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, device=DEV, generator=g) * K ** -0.5).to(torch.bfloat16)
    assert bik._tma_ok(x[:1], w)   # so gemm_nt below takes the TMA kernels, not only pointer loads
    want = bik.gemm_nt_pointers(x, w, bik.NARROW)
    for fn in (bik.gemm_nt_pointers, bik.gemm_nt_tma):
        for tile in (bik.NARROW, bik.WIDE):
            assert torch.equal(fn(x, w, tile), want), (fn.__name__, tile)
    # the swapped kernel at every tile swap_tile_for picks, over all 4096 rows and over few
    for bm, stages in bik.SWAP_STAGES.items():
        for bn in (64, 128):
            tile = (bm, bn, 128, 1, 4, stages)
            assert torch.equal(bik.gemm_swap_tma(x, w, tile), want), tile
            assert torch.equal(bik.gemm_swap_tma(x[:bm - 3], w, tile), want[:bm - 3]), tile
    assert bik.tile_for(4096, 151936, x.device) == bik.WIDE and bik.tile_for(64, 1024, x.device) == bik.NARROW
    assert bik.swap_tile_for(1, N, x.device)[0] == 16 and bik.swap_tile_for(65, N, x.device) is None
    for rows in (1, 8, 17, 33, 64, 65, 256, 1000, 4096):   # the swapped kernel up to 64 rows, then the others
        assert torch.equal(bik.gemm_nt(x[:rows], w), want[:rows]), rows


@pytest.mark.parametrize("K,N", [(2048, 64), (7168, 256)])
def test_fp32_gemm_tiles_give_the_same_bits(mode, K, N):
    """fp32 products (the MoE routers' logits) take the narrow FP32 tile: its CUDA-core chain gives a
    row the bits the bf16 tiles' shapes give it, at every row count and place in the batch, and the
    fp32 reference's values."""
    from paddle_mla.ops import batch_invariant_kernels as bik

    g = torch.Generator(device=DEV).manual_seed(K)
    x = torch.randn(1024, K, device=DEV, generator=g)
    w = torch.randn(N, K, device=DEV, generator=g) * K ** -0.5
    assert bik.tile_for(1024, N, x.device, dtype=x.dtype) == bik.FP32
    want = bik.gemm_nt_pointers(x, w, bik.FP32)
    for tile in (bik.NARROW, bik.WIDE):
        assert torch.equal(bik.gemm_nt_pointers(x, w, tile), want), tile
    alone = _assert_row_invariant(lambda t: mode.linear(t, w), x)
    assert torch.equal(alone[0], want[3])
    ref = x.double() @ w.double().T
    assert float((want.double() - ref).abs().max()) < 1e-4 * float(ref.abs().max())


def test_mla_decode_bf16_fixed_plan_row_invariant():
    from paddle_mla.attention.triton_mla.decode_plan import fixed_split_tiles, fixed_split_workspace

    k = kernel_namespace(DEV)
    rng = np.random.default_rng(0)
    H, lora, rope, page = 16, 512, 64, 64
    lens_all = rng.integers(1, 5000, 201).astype(np.int32)
    lens_all[3] = 4097                                   # the probe: three 2048-key splits
    bt, nb = random_block_tables(rng, lens_all, page)
    cache = torch.from_numpy(rng.standard_normal((nb, page, 1, lora + rope)).astype(np.float32)).to(DEV, torch.bfloat16)
    q_all = torch.from_numpy(rng.standard_normal((len(lens_all), H, lora + rope)).astype(np.float32))
    q_all = q_all.to(DEV, torch.bfloat16)
    tables, lens = torch.from_numpy(bt).to(DEV), torch.from_numpy(lens_all).to(DEV)
    cfg = k.dec.decode_config(64)      # the mode's config: the query-group one (backend.py)
    tiles = fixed_split_tiles(2048, cfg.block_n)

    def run(rows):
        bs = rows.shape[0]
        ws = fixed_split_workspace(bs, H, lora, 8192, 2048, cfg.block_n, DEV)
        k.dec.build_decode_plan(lens[rows], bs, ws, cfg.block_n, cfg.target_items, cfg.min_tiles, fixed_tiles=tiles)
        out = torch.empty(bs, H, lora, device=DEV, dtype=torch.bfloat16)
        k.dec.mla_decode(q_all[rows], cache, tables[rows].contiguous(), lens[rows].contiguous(), out, ws, lora,
                         (lora + rope) ** -0.5, cfg)
        return out

    idx = torch.arange(len(lens_all), device=DEV)
    alone = _assert_row_invariant(run, idx)
    ref = k.ref.mla_decode_ref(q_all[3:4].float(), cache.float(), tables[3:4], lens[3:4], lora, (lora + rope) ** -0.5)
    torch.testing.assert_close(alone.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("fp8", [False, True])
def test_fused_moe_row_invariant(mode, fp8):
    from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe
    from paddle_mla.models.fused_moe.reference import act_quant_reference, quant_block_fp8_reference

    E, top_k, N, K, M = 64, 6, 1408, 2048, 256
    rng = np.random.default_rng(1)
    ws_ = [torch.from_numpy(w).to(DEV, torch.bfloat16) for w in expert_weights(rng, E, N, K, scale=0.05)]
    x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(DEV, torch.bfloat16)
    ids_np, w_np = routing("random", M, E, top_k, 1)
    ids, w = torch.from_numpy(ids_np).to(DEV), torch.from_numpy(w_np).to(DEV)
    extra = {}
    if fp8:
        qs = [quant_block_fp8_reference(t) for t in ws_]
        ws_ = [q for q, _ in qs]
        extra = dict(w_gate_scale=qs[0][1], w_up_scale=qs[1][1], w_down_scale=qs[2][1], act_quant=act_quant_reference)
    work = MoEWorkspace(M, top_k, E, N, K, torch.bfloat16, DEV, fp8=fp8)
    idx = torch.arange(M, device=DEV)
    alone = _assert_row_invariant(lambda r: fused_moe(x[r], *ws_, ids[r], w[r], work, **extra), idx)
    assert torch.isfinite(alone.float()).all()


def test_fused_moe_bf16_row_invariant_across_the_config_switch(mode):
    """bf16 under the mode: a prefill-sized M takes the large wgmma config (launch_config.py), a
    lone row the mode's mid-size one; the row's bits agree, wherever it sits in the batch."""
    from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe
    from paddle_mla.models.fused_moe.launch_config import batch_invariant_config, get_config

    E, top_k, N, K, M = 64, 6, 1408, 2048, 4096
    assert get_config(M, E, N, K, top_k, "bf16", "any", True) != batch_invariant_config("bf16")
    rng = np.random.default_rng(2)
    ws_ = [torch.from_numpy(w).to(DEV, torch.bfloat16) for w in expert_weights(rng, E, N, K, scale=0.05)]
    x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(DEV, torch.bfloat16)
    ids_np, w_np = routing("random", M, E, top_k, 1)
    ids, w = torch.from_numpy(ids_np).to(DEV), torch.from_numpy(w_np).to(DEV)
    work = MoEWorkspace(M, top_k, E, N, K, torch.bfloat16, DEV)
    full = fused_moe(x, *ws_, ids, w, work)
    for probe in (0, 1234, M - 1):
        alone = fused_moe(x[probe:probe + 1], *ws_, ids[probe:probe + 1], w[probe:probe + 1], work)
        assert torch.equal(full[probe], alone[0]), probe


def test_fp8_linear_row_invariant(mode):
    from paddle_mla.models.fp8 import Fp8Weight, fp8_kernels_available, fp8_linear

    ok, why = fp8_kernels_available("gpu")
    if not ok:
        pytest.skip(why)
    n, k = 3072, 2048
    g = torch.Generator(device=DEV).manual_seed(0)
    w = torch.randn(n, k, device=DEV, generator=g) * 0.05
    scale = w.reshape(n // 128, 128, k // 128, 128).abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (w.reshape(n // 128, 128, k // 128, 128) / scale[:, None, :, None]).reshape(n, k)
    wt = Fp8Weight(q.clamp(-448, 448).to(torch.float8_e4m3fn), scale.contiguous(), (128, 128), kernel=True)
    x = torch.randn(256, k, device=DEV, generator=g).to(torch.bfloat16)
    alone = _assert_row_invariant(lambda t: fp8_linear(t, wt), x)
    ref = x[3:4].float() @ w.T
    assert float((alone.float() - ref).abs().mean()) < 0.05 * float(ref.abs().mean())


def test_rms_norm_of_a_strided_view_row_invariant(mode):
    """MLA's latent is a view split from the rope part; under the mode it takes the row kernel."""
    from paddle_mla.models.fused_ops import rms_norm

    g = torch.Generator(device=DEV).manual_seed(5)
    ckv = torch.randn(256, 576, device=DEV, generator=g).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(512, device=DEV, generator=g)).to(torch.bfloat16)
    alone = _assert_row_invariant(lambda t: rms_norm(t[:, :512], weight, 1e-6), ckv)
    xf = ckv[3:4, :512].float()
    ref = weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16).float()
    torch.testing.assert_close(alone.float(), ref, atol=2e-2, rtol=2e-2)
