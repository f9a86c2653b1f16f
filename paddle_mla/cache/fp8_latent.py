"""The FP8 latent cache (``cache.dtype: fp8_e4m3``, MLA models): the format and its plain-tensor codec.

A token's row in a layer's cache ([num_blocks, block_size, 1, row_width(latent_dim)], float8 e4m3) is
its latent (kv_lora_rank compressed values, then the roped key) divided by one power-of-two scale and
rounded to e4m3 (round to nearest even), zero-padded to a multiple of 4 bytes (``scale_offset``), then
the scale as float32, then zeros to a multiple of 16 bytes. 592 bytes a token at DeepSeek's 512 + 64
against 1152 in bf16: 1.95x the tokens in the same memory, and half the bytes each decode step reads.
A row's width does not name its latent's: readers take that from their own inputs (the query, the
step's latent).

Why this shape:
- one scale per token: FP8 is a floating-point format, so its relative error (2^-4 at most) does not
  depend on a value's size; a scale only has to keep the row's largest value below e4m3's 448 and its
  small ones above the subnormals. Per-128-value scales (FlashMLA's V3.2 format) buy little for that,
  and one scale a row folds into the kernels as a factor on each key's score and probability, so they
  feed the FP8 tile to the dots as it is (converted to the compute dtype) with no per-element multiply;
- a power of two (the row's largest magnitude lands in [128, 256)): scaling is exact, so the Triton
  write, this codec and every reader agree to the bit, on CPU and GPU;
- the rounding to e4m3's 3 mantissa bits is done in float32 bits (round to nearest even), so the
  cast that follows is exact: implementations of the cast differ at a mantissa's carry (the Triton
  interpreter's drops it) and at subnormals. Values that scale below e4m3's smallest normal (2^-6,
  under 2^-13 of the row's largest) are stored as zero: what they add to a score is below the
  largest value's own rounding;
- the roped key stays in the same row and scale: its values are of the latent's size after the
  norm, and one row format keeps one pointer a key in every kernel;
- the scale on a 4-byte boundary and rows of whole 16 bytes: aligned loads, and rows that Paddle's CPU
  kernels copy as int32 words (they index no 1-byte dtype).

The new tokens of a step are written before any kernel reads them, and every reader takes them from
the cache, so prefill, chunked prefill, prefix-cache hits and decode all see the same rounded keys.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

# a row's scale is 2^(e - SCALE_SHIFT - 127) for its largest magnitude's biased exponent e (clamped to
# MIN_EXPONENT so a zero row gets a finite scale): the largest value lands in [128, 256) of e4m3's 448
SCALE_SHIFT = 7
MIN_EXPONENT = 8
SMALLEST_NORMAL = 2.0 ** -6         # e4m3's; scaled values below it are stored as zero
MANTISSA_DROP = 20                  # float32's 23 mantissa bits less e4m3's 3
MANTISSA_DROP_HALF = (1 << 19) - 1  # rounding bias: half an e4m3 step less one (ties: + the kept last bit)


def storage_dtype():
    return torch.float8_e4m3fn


def is_fp8(kv_cache) -> bool:
    return kv_cache.dtype == torch.float8_e4m3fn


def scale_offset(latent_dim: int) -> int:
    """Byte offset of a row's float32 scale: the latent's width rounded up to 4."""
    return -(-latent_dim // 4) * 4


def row_width(latent_dim: int) -> int:
    """Bytes (FP8 elements) of one token's row: the latent, the scale, zeros to a multiple of 16."""
    return -(-(scale_offset(latent_dim) + 4) // 16) * 16


def cache_width(kv_cache, latent_dim: int) -> int:
    """The row width a cache of ``latent_dim`` latents has in its dtype (FP8 rows or plain ones)."""
    return row_width(latent_dim) if is_fp8(kv_cache) else latent_dim


def _pow2(biased_exponent):
    """2^(biased_exponent - 127) as float32, from int32 exponents in [1, 254]."""
    return (biased_exponent << 23).view(torch.float32)


def row_scales(latent):
    """(scale, 1 / scale) per row of ``latent`` [T, D], both float32 [T] powers of two."""
    amax = latent.to(torch.float32).abs().amax(-1)
    e = torch.clamp(amax.view(torch.int32) >> 23, min=MIN_EXPONENT)    # amax >= 0: no sign bit
    return _pow2(e - SCALE_SHIFT), _pow2(254 + SCALE_SHIFT - e)


def round_to_e4m3(y):
    """float32 ``y`` (|y| < 448) rounded to the nearest e4m3 value, ties to even, in float32; zero below
    the smallest normal. Integer arithmetic on the bits: the mantissa's carry runs into the exponent."""
    bits = y.view(torch.int32)
    # shifts and a floor modulo, not masks: the same two's-complement arithmetic on either runtime
    bits = bits + MANTISSA_DROP_HALF + (bits >> MANTISSA_DROP) % 2
    r = ((bits >> MANTISSA_DROP) << MANTISSA_DROP).view(torch.float32)
    return torch.where(y.abs() < SMALLEST_NORMAL, torch.zeros_like(r), r)


# The byte work below goes through uint8 views: Paddle's CPU kernels copy, slice and index uint8
# tensors but not float8 ones.

def quantize(latent):
    """latent [T, D] (any float dtype) -> packed rows [T, row_width(D)] float8 e4m3."""
    T, D = latent.shape
    off = scale_offset(D)
    scale, inv = row_scales(latent)
    q = round_to_e4m3(latent.to(torch.float32) * inv[:, None]).to(torch.float8_e4m3fn)
    zeros = lambda n: torch.zeros(T, n, dtype=torch.uint8, device=latent.device)  # noqa: E731
    parts = [q.view(torch.uint8), zeros(off - D), scale.contiguous().view(torch.uint8).view(T, 4),
             zeros(row_width(D) - off - 4)]
    return torch.cat(parts, 1).view(torch.float8_e4m3fn)


def dequantize(packed, latent_dim: int):
    """packed rows [..., row_width(latent_dim)] float8 e4m3 -> float32 [..., latent_dim]."""
    off = scale_offset(latent_dim)
    raw = packed.view(torch.uint8)
    scale = raw[..., off:off + 4].contiguous().view(torch.float32)
    return raw[..., :latent_dim].contiguous().view(torch.float8_e4m3fn).to(torch.float32) * scale


def write_rows(flat, slots, latent) -> None:
    """Cache rows ``flat`` [N, width]: row ``slots[t]`` = ``latent[t]``, quantized into FP8 rows
    [N, row_width(D)], cast into a plain cache's dtype."""
    if is_fp8(flat):
        flat.view(torch.int32)[slots] = quantize(latent).view(torch.int32)
    else:
        flat[slots] = latent.to(flat.dtype)


def read_rows(flat, rows, latent_dim: int):
    """The cache rows ``flat[rows]``: float32 [len(rows), latent_dim] from FP8 rows, a plain cache's
    rows as stored."""
    if not is_fp8(flat):
        return flat.index_select(0, rows)
    return dequantize(flat.view(torch.int32).index_select(0, rows).view(torch.float8_e4m3fn), latent_dim)
