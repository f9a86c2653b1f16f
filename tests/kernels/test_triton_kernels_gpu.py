"""Triton MLA kernels on the GPU: bf16 at realistic MLA shapes vs the plain-tensor references,
bitwise determinism over 5 runs, outputs poisoned before every run, CUDA-graph capture of the
decode step. Run by scripts/gpu_check.sh on the GPU machine; skipped in CPU CI."""

import numpy as np
import pytest
from helpers.triton_kernel_helpers import check_close as _check_close
from helpers.triton_kernel_helpers import check_graph_replay
from helpers.triton_kernel_helpers import kernel_namespace, random_block_tables
from helpers.triton_kernel_helpers import poisoned_runs as _poisoned_runs
from helpers.triton_kernel_helpers import upload as _up

from paddle_mla.platform import runtime

pytestmark = [pytest.mark.gpu, pytest.mark.triton]

LORA, ROPE, PAGE = 512, 64, 64
SEQ_CASES = [[64], [32, 64, 128, 48], [1024], [1, 3], [0, 5000, 17, 300]]


@pytest.fixture(scope="module")
def k():
    return kernel_namespace(runtime.device_string("gpu"))


# launch variants, forced at h=128 (each must match the reference, deterministically, and fill
# every element): value-column slices and smaller head blocks
VARIANTS_128 = [{}, {"dv_split": 2}, {"dv_split": 4}, {"block_h": 32}]
# h=16: the small-batch config (5 stages, one-step merge, stage 2 by programmatic dependent launch)
# and other pipeline depths
VARIANTS_16 = [{}, {"small_batch": True}, {"num_stages": 5}, {"num_stages": 8, "block_n": 16},
               {"num_stages": 5, "num_warps": 8, "waves": 1}]


@pytest.mark.parametrize("heads,variant", [(16, v) for v in VARIANTS_16] + [(128, v) for v in VARIANTS_128],
                         ids=lambda x: str(x).replace(" ", ""))
@pytest.mark.parametrize("seq_lens", SEQ_CASES)
def test_decode_bf16(k, heads, variant, seq_lens):
    torch = k.torch
    rng = np.random.default_rng(sum(seq_lens) + heads)
    bt, nb = random_block_tables(rng, seq_lens, PAGE, 2)
    bs = len(seq_lens)
    cache = torch.randn(nb, PAGE, 1, LORA + ROPE, device=k.dev).to(torch.bfloat16)
    q = torch.randn(bs, heads, LORA + ROPE, device=k.dev).to(torch.bfloat16)
    lens, tables = _up(k, np.array(seq_lens, dtype=np.int32)), _up(k, bt)
    scale = 192 ** -0.5
    cfg = k.dec.decode_config(heads, **variant)
    ws = k.dec.alloc_decode_workspace(8, heads, LORA, k.dec.split_cap(cfg.programs), k.dev, programs=cfg.programs)
    out = torch.empty(bs, heads, LORA, device=k.dev, dtype=torch.bfloat16)

    def run():
        k.dec.build_decode_plan(lens, bs, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
        k.dec.mla_decode(q, cache, tables, lens, out, ws, LORA, scale, cfg)

    got = _poisoned_runs(k, run, out)
    ref = k.ref.mla_decode_ref(q.float(), cache.float(), tables, lens, LORA, scale)
    _check_close(k, got, ref)


@pytest.mark.parametrize("heads,variant", [(16, {}), (16, {"small_batch": True}),
                                           (128, {"dv_split": 2})], ids=["h16", "h16-small-batch", "h128-dv2"])
def test_decode_cuda_graph_replay(k, heads, variant):
    """Plan + decode captured once, replayed with new lengths in the same buffers (no per-call allocation)."""
    torch = k.torch
    if runtime.is_paddle():
        pytest.skip("graph capture is exercised through the torch runtime here")
    rng = np.random.default_rng(5)
    bs = 4
    bt, nb = random_block_tables(rng, [4096] * bs, PAGE, 2)
    cache = torch.randn(nb, PAGE, 1, LORA + ROPE, device=k.dev).to(torch.bfloat16)
    q = torch.randn(bs, heads, LORA + ROPE, device=k.dev).to(torch.bfloat16)
    tables = _up(k, bt)
    lens = _up(k, np.array([10, 10, 10, 10], dtype=np.int32))
    cfg = k.dec.decode_config(heads, **variant)
    ws = k.dec.alloc_decode_workspace(bs, heads, LORA, k.dec.split_cap(cfg.programs), k.dev, programs=cfg.programs)
    out = torch.empty(bs, heads, LORA, device=k.dev, dtype=torch.bfloat16)

    def step():
        k.dec.build_decode_plan(lens, bs, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
        k.dec.mla_decode(q, cache, tables, lens, out, ws, LORA, 0.07, cfg)

    check_graph_replay(k, step, q, cache, tables, lens, out, LORA, 0.07)


@pytest.mark.parametrize("heads,variant", [(16, {"small_batch": True}), (16, {}), (128, {})],
                         ids=["h16-small-batch", "h16", "h128"])
def test_decode_one_long_row_over_the_whole_grid(k, heads, variant):
    """b=1 at 16k + 17 tokens with the backend's split cap (``split_cap``): the plan spreads the row
    over up to 65 splits (the cap binds at h=16 on a GPU of >= 66 SMs: 57 splits of 9 tiles), and the
    merge of that many splits (several chunks of the default config's stage-2 loop, one step in the
    small-batch config) matches the reference, bitwise repeatably."""
    torch = k.torch
    seq = 16384 + 17
    bt, nb = random_block_tables(np.random.default_rng(9), [seq], PAGE, 2)
    cache = torch.randn(nb, PAGE, 1, LORA + ROPE, device=k.dev).to(torch.bfloat16)
    q = torch.randn(1, heads, LORA + ROPE, device=k.dev).to(torch.bfloat16)
    lens, tables = _up(k, np.array([seq], dtype=np.int32)), _up(k, bt)
    cfg = k.dec.decode_config(heads, **variant)
    ws = k.dec.alloc_decode_workspace(1, heads, LORA, k.dec.split_cap(cfg.programs), k.dev, programs=cfg.programs)
    out = torch.empty(1, heads, LORA, device=k.dev, dtype=torch.bfloat16)

    def run():
        k.dec.build_decode_plan(lens, 1, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
        k.dec.mla_decode(q, cache, tables, lens, out, ws, LORA, 192 ** -0.5, cfg)

    got = _poisoned_runs(k, run, out)
    splits, _, _ = k.ref.decode_plan_ref(lens, cfg.block_n, cfg.programs, ws.max_kv_splits, cfg.min_tiles)
    assert int(ws.num_kv_splits[0]) == int(splits[0])
    assert int(splits[0]) <= k.dec.split_cap(cfg.programs) <= 65
    if cfg.programs >= 66:
        assert int(splits[0]) > 16   # more than one merge chunk of the default config
    _check_close(k, got, k.ref.mla_decode_ref(q.float(), cache.float(), tables, lens, LORA, 192 ** -0.5))


def test_write_latent_cache_bf16(k):
    torch = k.torch
    cache = torch.randn(8, PAGE, 1, LORA + ROPE, device=k.dev).to(torch.bfloat16)
    expect = cache.clone()
    slots = _up(k, np.array([0, 65, -1, 511, 130, -1], dtype=np.int64))
    lat = torch.randn(6, LORA + ROPE, device=k.dev).to(torch.bfloat16)
    k.cw.write_latent_cache(lat, cache, slots)
    k.ref.write_latent_cache_ref(lat, expect, slots)
    assert torch.equal(cache, expect)


def test_read_cache_and_interleave_bf16_bitwise(k):
    torch = k.torch
    rng = np.random.default_rng(3)
    q_lens, c_lens = [100, 1, 0, 300, 7], [1000, 64, 63, 0, 129]
    k_lens = [a + b for a, b in zip(q_lens, c_lens)]
    bt, nb = random_block_tables(rng, k_lens, PAGE, 2)
    cache = torch.randn(nb, PAGE, 1, LORA + ROPE, device=k.dev).to(torch.bfloat16)
    new = torch.randn(sum(q_lens), LORA + ROPE, device=k.dev).to(torch.bfloat16)
    cu_q = _up(k, np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32))
    cu_k = _up(k, np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32))
    out = torch.empty(sum(k_lens), LORA + ROPE, device=k.dev, dtype=torch.bfloat16)
    got = _poisoned_runs(k, lambda: k.il.read_cache_and_interleave(cache, _up(k, bt), new, cu_q, cu_k,
                                                                    sum(k_lens), out=out), out)
    expect = k.ref.read_cache_and_interleave_ref(cache, _up(k, bt), new, cu_q, cu_k, sum(k_lens))
    assert torch.equal(got, expect)


@pytest.mark.parametrize("q_lens,c_lens", [([64], [0]), ([32, 64, 128, 48], [0, 100, 7, 1000]), ([1, 3], [5, 0]),
                                           ([1024], [512])])
def test_prefill_bf16(k, q_lens, c_lens):
    torch = k.torch
    h, dqk, dv = 16, 192, 128
    k_lens = [a + b for a, b in zip(q_lens, c_lens)]
    q = torch.randn(sum(q_lens), h, dqk, device=k.dev).to(torch.bfloat16)
    kk = torch.randn(sum(k_lens), h, dqk, device=k.dev).to(torch.bfloat16)
    v = torch.randn(sum(k_lens), h, dv, device=k.dev).to(torch.bfloat16)
    cu_q = _up(k, np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32))
    cu_k = _up(k, np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32))
    out = torch.empty(sum(q_lens), h, dv, device=k.dev, dtype=torch.bfloat16)
    scale = dqk ** -0.5
    got = _poisoned_runs(k, lambda: k.pf.prefill_attention(q, kk, v, cu_q, cu_k, max(q_lens), scale, out=out), out)
    _check_close(k, got, k.ref.prefill_ref(q.float(), kk.float(), v.float(), cu_q, cu_k, scale))


# extend kernel launch variants (benchmarks.kernels.mla_prefill): each must match the reference
EXTEND_VARIANTS = [{}, {"reverse_m": 0}, {"block_n": 128, "num_stages": 2}, {"num_stages": 2},
                   {"block_m": 64, "num_warps": 4}]


@pytest.mark.parametrize("variant", EXTEND_VARIANTS, ids=lambda x: str(x).replace(" ", ""))
@pytest.mark.parametrize("chunk", [None, 700])
def test_mla_extend_layout_chunked_bf16(k, variant, chunk):
    """The MLA layout ExtendWorkspace uses (k_pe one row per token, shared by the heads), keys in
    one launch or in chunks that cut tiles and requests mid-way (LSE merge), bitwise repeatable."""
    torch = k.torch
    h, nope, rope, dv = 16, 128, 64, 128
    q_lens, c_lens = [300, 1, 1029, 64], [0, 77, 500, 2000]
    k_lens = [a + b for a, b in zip(q_lens, c_lens)]
    tq, tk = sum(q_lens), sum(k_lens)
    q = torch.randn(tq, h, nope + rope, device=k.dev).to(torch.bfloat16)
    k_nope = torch.randn(tk, h, nope, device=k.dev).to(torch.bfloat16)
    k_pe = torch.randn(tk, rope, device=k.dev).to(torch.bfloat16)
    v = torch.randn(tk, h, dv, device=k.dev).to(torch.bfloat16)
    cu_q = _up(k, np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32))
    cu_k = _up(k, np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32))
    out = torch.empty(tq, h, dv, device=k.dev, dtype=torch.bfloat16)
    lse = torch.empty(tq, h, device=k.dev, dtype=torch.float32)
    scale = (nope + rope) ** -0.5
    cfg = k.pf.extend_config(nope, rope, dv, **variant)
    step = chunk or tk

    def run():
        for start in range(0, tk, step):
            n = min(step, tk - start)
            k.pf.extend_attention(q[:, :, :nope], q[:, :, nope:], k_nope[start:start + n], k_pe[start:start + n],
                                  v[start:start + n], out, lse if chunk else None, cu_q, cu_k, max(q_lens), scale,
                                  k_start=start, k_rows=n, merge=start > 0, k_b_shared=True, cfg=cfg)

    got = _poisoned_runs(k, run, out, runs=3)
    kk = torch.cat([k_nope, k_pe[:, None, :].expand(-1, h, -1)], dim=-1)
    _check_close(k, got, k.ref.prefill_ref(q.float(), kk.float(), v.float(), cu_q, cu_k, scale))
