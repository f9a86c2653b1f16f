"""The ``mla_decode`` CUDA op (SM90 warpgroup kernel) over FP8 cache rows (``cache.fp8_latent``): its
output equals, bit for bit, the op's over the same rows dequantized to a bf16 cache (the kernel's
converted tile is exactly those rows; FP8 rows take the 64-head kernel at every head count, so the bf16
run is pinned to it where the default would be the narrow kernel), over head counts, page sizes (one TMA
box a tile, or several), ragged, 1-token and zero-length rows, rows of very different sizes (scales from
2^-40 to 2^8, both conversion paths) and stale slots poisoned with NaN bytes past each row's length; it
matches the fp32 reference over the FP8 rows; every run is bitwise the same; an mma.sync config refuses
FP8."""

import numpy as np
import pytest
from helpers.triton_kernel_helpers import check_close, cuda_mla_namespace, launch_overrides, random_block_tables
from helpers.triton_kernel_helpers import poisoned_runs
from helpers.triton_kernel_helpers import upload as _up

pytestmark = [pytest.mark.gpu, pytest.mark.triton]

LORA, D = 512, 576
SEQ_CASES = [[1], [64], [32, 64, 128, 48], [1, 3], [0, 5000, 17, 300], [4097, 33, 1, 2048, 0, 95]]


@pytest.fixture(scope="module")
def k():
    return cuda_mla_namespace("mla_decode")


def _case(k, seq_lens, heads, page, seed, wild=False):
    """(FP8 cache, the same cache with each row's stale slots set to 0xFF bytes, q, tables, lens).
    ``wild``: rows of very different sizes, scales 2^-40 .. 2^8 (the largest: the two-factor path)."""
    torch, f8 = k.torch, k.f8
    rng = np.random.default_rng(seed)
    bt, nb = random_block_tables(rng, seq_lens, page, 2)
    rows = rng.standard_normal((nb * page, D)).astype(np.float32)
    if wild:
        rows *= 10.0 ** rng.uniform(-10, 3, size=(nb * page, 1)).astype(np.float32)
        rows[::7, 5] = 3e4   # scale 2^7, the one-factor path's largest
        rows[::11, 9] = 6e4  # scale 2^8
    cache = f8.quantize(_up(k, rows)).view(nb, page, 1, f8.row_width(D))
    poisoned = cache.clone()
    raw = poisoned.view(torch.uint8)
    for i, n in enumerate(seq_lens):
        if n % page:
            raw[int(bt[i, n // page]), n % page:] = 0xFF
    q = _up(k, rng.standard_normal((len(seq_lens), heads, D)).astype(np.float32)).to(torch.bfloat16)
    return cache, poisoned, q, _up(k, bt), _up(k, np.array(seq_lens, dtype=np.int32))


@pytest.mark.parametrize("heads,page", [(16, 64), (16, 16), (128, 64), (128, 8), (20, 48), (1, 32), (100, 128)],
                         ids=lambda x: str(x))
@pytest.mark.parametrize("seq_lens", SEQ_CASES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("wild", [False, True], ids=["normal_rows", "wild_rows"])
def test_fp8_rows_equal_their_dequantized_bf16_rows(k, heads, page, seq_lens, wild):
    torch, f8 = k.torch, k.f8
    cache, poisoned, q, tables, lens = _case(k, seq_lens, heads, page, sum(seq_lens) + heads + page, wild)
    bs, scale = len(seq_lens), 192 ** -0.5
    plain = f8.dequantize(cache, D).to(torch.bfloat16)
    dec = k.cd.CudaDecode(heads, 8, k.dev)   # the default configs: FP8 rows take the 64-head one
    wg64 = k.cd.CudaDecode(heads, 8, k.dev, **launch_overrides(k.cd.op.WARPGROUP))
    assert (wg64.launch.programs, wg64.split_cost) == (dec.launch.programs, dec.split_cost)   # the same plan
    assert dec.fp8_launch == wg64.launch   # FP8 rows take the 64-head config

    def run(d, kv, out):
        d.plan(lens, bs)
        d.run(q, kv, tables, lens, out, bs, scale)

    out = torch.empty(bs, heads, LORA, device=k.dev, dtype=torch.bfloat16)
    got = poisoned_runs(k, lambda: run(dec, poisoned, out), out)
    want = torch.empty_like(out)
    run(wg64, plain, want)
    assert torch.equal(got, want), f"max diff {float((got.float() - want.float()).abs().max())}"
    if not wild:   # outputs of the rows' size: the reference's tolerances are for values near 1
        check_close(k, got, k.ref.mla_decode_ref(q.float(), cache, tables, lens, LORA, scale))


def test_mma_sync_config_refuses_fp8_rows(k):
    cache, _, q, tables, lens = _case(k, [100], 16, 64, 0)
    dec = k.cd.CudaDecode(16, 1, k.dev, row_blocks=1, col_splits=4, block_n=32, stages=4)
    out = k.torch.empty(1, 16, LORA, device=k.dev, dtype=k.torch.bfloat16)
    dec.plan(lens, 1)
    with pytest.raises(RuntimeError, match="64-head warpgroup config only"):
        dec.run(q, cache, tables, lens, out, 1, 0.1)
