"""The FP8 latent cache (``cache.fp8_latent``): the codec's rule, the Triton write bit for bit against it,
the split-KV decode's value slices and odd dims over FP8 rows, and the bf16 decode at V3 dims (GPU),
against the plain references over the dequantized rows (the decode, query groups and the extend's
gather over FP8 rows: test_triton_kernels.py). CPU interpreter (float32) or GPU, like that file."""

import numpy as np
import pytest
from helpers.triton_kernel_helpers import decode_case, device_and_tolerance, kernel_namespace, random_block_tables
from helpers.triton_kernel_helpers import upload as _up

pytestmark = pytest.mark.triton

DEV, TOL = device_and_tolerance()


@pytest.fixture(scope="module")
def k():
    return kernel_namespace(DEV)


def _bytes(k, x):
    return x.view(k.torch.uint8)


def _rows(rng, n, d):
    """Rows of very different sizes (1e-6 .. 1e4), one all zero, one with a single large outlier, one of
    ties (``TIES``: scale 1, halfway between two e4m3 values)."""
    x = rng.standard_normal((n, d)).astype(np.float32) * (10.0 ** rng.uniform(-6, 4, size=(n, 1)))
    x[0] = 0.0
    x[1, 3] = 5e4
    x[3] = np.resize(TIES[0], d)
    return x.astype(np.float32)


# a row whose largest magnitude is 128 (scale 1) and its e4m3 rounding, ties to the even mantissa
TIES = (np.array([128, 136, 152, 1.0625, 1.1875, -136, -1.0625, 3.0], dtype=np.float32),
        np.array([128, 128, 160, 1.0, 1.25, -128, -1.0, 3.0], dtype=np.float32))


def test_codec_rule(k):
    """Each row's scale is a power of two putting its largest magnitude in [128, 256); every value is
    its e4m3 rounding (relative error <= 2^-4) or, below e4m3's smallest normal, zero; a zero row stays zero; the
    scale sits in the slot's first 4 bytes."""
    torch, f8 = k.torch, k.f8
    x = _up(k, _rows(np.random.default_rng(0), 9, 72))
    packed = f8.quantize(x)
    assert packed.shape == (9, 80) and packed.dtype == f8.storage_dtype()     # 72 + scale, to 16 bytes
    scale, inv = f8.row_scales(x)
    assert torch.equal(scale * inv, torch.ones_like(scale))
    mant, _ = torch.frexp(scale)
    assert torch.equal(mant, torch.full_like(mant, 0.5))               # powers of two
    top = x.abs().amax(1)[1:] * inv[1:]
    assert bool(((top >= 128) & (top < 256)).all())
    back = f8.dequantize(packed, 72)
    assert torch.equal(back[0], torch.zeros_like(back[0]))
    big = x.abs() * inv[:, None] >= f8.SMALLEST_NORMAL               # normal e4m3 values
    err = (back - x).abs()
    assert bool((err[big] <= x.abs()[big] * 2.0 ** -4).all())
    assert bool((back[~big] == 0).all()) and bool((~big[1:]).any())
    stored = packed.view(torch.uint8)[:, 72:76].contiguous().view(torch.float32)[:, 0]
    assert torch.equal(stored, scale)
    ties = f8.dequantize(f8.quantize(_up(k, TIES[0][None])), len(TIES[0]))
    assert torch.equal(ties[0], _up(k, TIES[1]))


def test_row_layout(k):
    """The scale on a 4-byte boundary after the latent, rows of whole 16 bytes."""
    f8 = k.f8
    assert [(f8.scale_offset(d), f8.row_width(d)) for d in (576, 72, 37, 12)] == [(576, 592), (72, 80), (40, 48),
                                                                                (12, 16)]


@pytest.mark.parametrize("d", [37, 40, 576])
def test_write_kernel_matches_codec_bitwise(k, d):
    torch, f8 = k.torch, k.f8
    rng = np.random.default_rng(d)
    nb, page = 4, 16
    cache = torch.zeros(nb, page, 1, f8.row_width(d), dtype=f8.storage_dtype(), device=DEV)
    _bytes(k, cache).fill_(0x5A)             # stale bytes: skipped slots must keep them
    expect = cache.clone()
    slots = np.array([0, 17, -1, 63, 5, -1, 32, 9, 10], dtype=np.int64)
    lat = _up(k, _rows(rng, len(slots), d))
    k.cw.write_latent_cache(lat, cache, _up(k, slots))
    k.ref.write_latent_cache_ref(lat, expect, _up(k, slots))
    # the latent, its pad and the scale are the format; the zeros after the scale are never read
    end = f8.scale_offset(d) + 4
    assert torch.equal(_bytes(k, cache)[..., :end], _bytes(k, expect)[..., :end])
    assert torch.equal(_bytes(k, cache)[1, 0, 0], _bytes(k, expect)[1, 0, 0])   # an unwritten row
    assert int(_bytes(k, cache)[3, 15, 0, 0]) != 0x5A                           # slot 63 was written


# Reading FP8 rows: the decode, query groups and the extend's gather over an FP8 cache run in
# test_triton_kernels.py (its cache parameter; the plain decode at dims 32 + 16 among them); here the
# decode's value slices and odd dims over them.
@pytest.mark.parametrize("variant,lora,rope", [({}, 30, 7), ({"dv_split": 2}, 32, 16), ({"dv_split": 2}, 30, 7)],
                         ids=["plain-dims37", "dv_split2-dims48", "dv_split2-dims37"])
@pytest.mark.parametrize("seq_lens", [[1], [3, 17, 64, 5], [40, 0, 16, 33]])
def test_decode_over_fp8_cache_matches_reference(k, seq_lens, variant, lora, rope):
    decode_case(k, seq_lens, heads=4, lora=lora, rope=rope, page=16, target=3, seed=len(seq_lens), fp8=True,
                **variant)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("seq_lens", [[1], [4096, 37, 1000], [64] * 70])
def test_decode_bf16_over_fp8_cache_at_v3_dims(k, heads, seq_lens):
    """DeepSeek-V3 dims (512 + 64), bf16 queries, rows written by the Triton write kernel: the decode
    (the backend's configs, the small-batch one at b <= 4) against the fp32 reference over the same
    dequantized rows, to bf16 precision; and the output differs from the bf16 cache's by the keys'
    rounding only (relative L2 < 5%, measured ~1-2%)."""
    from helpers.triton_kernel_helpers import check_close

    torch, f8 = k.torch, k.f8
    rng = np.random.default_rng(heads)
    lora, lk, page = 512, 576, 64
    bt, nb = random_block_tables(rng, seq_lens, page)
    bs = len(seq_lens)
    rows = torch.randn(nb * page, lk, device=DEV, dtype=torch.bfloat16)
    plain = rows.view(nb, page, 1, lk)
    cache = torch.zeros(nb, page, 1, f8.row_width(lk), dtype=f8.storage_dtype(), device=DEV)
    k.cw.write_latent_cache(rows, cache, torch.arange(nb * page, device=DEV))
    q = torch.randn(bs, heads, lk, device=DEV, dtype=torch.bfloat16)
    lens, tables = _up(k, np.array(seq_lens, dtype=np.int32)), _up(k, bt)
    cfg = k.dec.decode_config(heads, small_batch=bs <= k.dec.SMALL_BATCH)
    ws = k.dec.alloc_decode_workspace(bs, heads, lora, k.dec.split_cap(cfg.programs), DEV, programs=cfg.programs)
    k.dec.build_decode_plan(lens, bs, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
    out = torch.full((bs, heads, lora), float("nan"), device=DEV, dtype=torch.bfloat16)
    k.dec.mla_decode(q, cache, tables, lens, out, ws, lora, 192 ** -0.5, cfg)
    check_close(k, out, k.ref.mla_decode_ref(q.float(), cache, tables, lens, lora, 192 ** -0.5))
    exact = k.ref.mla_decode_ref(q.float(), plain.float(), tables, lens, lora, 192 ** -0.5)
    assert float((out.float() - exact).norm() / exact.norm()) < 5e-2
