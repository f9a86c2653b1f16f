"""Triton MLA kernels vs their plain-tensor references, TINY shapes, float32.

Runs under TRITON_INTERPRET=1 with the torch runtime on CPU (the interpreter has no bfloat16 and
takes only PyTorch tensors), or on a GPU. Skipped by the ``triton`` marker where Triton cannot
launch. bf16 at realistic shapes: tests/kernels/test_triton_kernels_gpu.py.
"""

import numpy as np
import pytest
from helpers.triton_kernel_helpers import decode_case, device_and_tolerance, kernel_namespace, paged_cache
from helpers.triton_kernel_helpers import random_block_tables, upload

pytestmark = pytest.mark.triton

DEV, TOL = device_and_tolerance()


@pytest.fixture(scope="module")
def k():
    return kernel_namespace(DEV)


def test_write_latent_cache_skips_negative_slots(k):
    torch = k.torch
    rng = np.random.default_rng(0)
    nb, page, d = 4, 16, 40
    cache = torch.randn(nb, page, 1, d, device=DEV)
    expect = cache.clone()
    slots = np.array([0, 17, -1, 63, 5, -1, 32], dtype=np.int64)
    lat = upload(k, rng.standard_normal((len(slots), d)).astype(np.float32))
    k.cw.write_latent_cache(lat, cache, upload(k, slots))
    k.ref.write_latent_cache_ref(lat, expect, upload(k, slots))
    assert torch.equal(cache, expect)
    assert torch.equal(cache[0, 0, 0], lat[0]) and torch.equal(cache[1, 1, 0], lat[1])


@pytest.mark.parametrize("split_cost", [0, 57, 228], ids=["balanced", "cost57", "cost228"])
@pytest.mark.parametrize("seq_lens", [[0], [5], [3, 17, 64, 5, 0, 0], [1000, 1, 0, 40], [320, 300, 333, 290]])
def test_decode_plan_matches_reference(k, seq_lens, split_cost):
    """The GPU-built plan equals the plain reference, with and without the split-aware window size."""
    torch = k.torch
    bs, max_bs, max_splits = len(seq_lens), 8, 4
    ws = k.dec.alloc_decode_workspace(max_bs, 4, 32, max_splits, DEV)
    lens = upload(k, np.array(seq_lens + [7] * (max_bs - bs), dtype=np.int32))
    for programs in (1, 5, 64):
        k.dec.build_decode_plan(lens, bs, ws, block_n=16, target_items=programs, split_cost=split_cost)
        splits, cu, q = k.ref.decode_plan_ref(lens[:bs], 16, programs, max_splits, split_cost=split_cost,
                                              search=k.dec.PLAN_SEARCH)
        assert torch.equal(ws.num_kv_splits[:bs], splits)
        assert torch.equal(ws.cu_tiles[:bs + 1], cu)
        assert int(ws.tiles_per_prog[0]) == int(q)
        assert 1 <= int(splits.min()) and int(splits.max()) <= max_splits
        # compact workspace: request b owns partial rows [split_start[b], split_start[b] + splits[b])
        start = k.torch.cumsum(splits.to(k.torch.int64), 0)
        assert torch.equal(ws.split_start[:bs + 1].to(k.torch.int64),
                           k.torch.cat([k.torch.zeros(1, dtype=k.torch.int64, device=DEV), start]))
        assert int(start[-1]) <= bs + programs - 1


def test_split_aware_plan_keeps_uniform_rows_whole(k):
    """64 rows of 64 tiles over 66 programs: the balanced plan takes windows of 63 tiles (every row in
    two splits); with a split's cost counted (128 KB of partials a row at 64 heads against a 72 KB
    tile) it takes 64 (one window a row, no partials), and a cost of 0 keeps 63."""
    lens = upload(k, np.full(64, 64 * 64, dtype=np.int32))
    cost = k.dec.split_cost_of(64, 512, 64, 576)
    assert cost == 228
    for split_cost, q_want, splits_want in ((0, 63, 2), (cost, 64, 1)):
        ws = k.dec.alloc_decode_workspace(64, 64, 512, 67, DEV, programs=66)
        k.dec.build_decode_plan(lens, 64, ws, block_n=64, target_items=66, min_tiles=2, split_cost=split_cost)
        assert int(ws.tiles_per_prog[0]) == q_want
        assert int(ws.num_kv_splits.max()) == splits_want


@pytest.mark.parametrize("max_bs,max_splits,programs", [(128, 32, 66), (8, 4, 64), (4, 16, 0)])
def test_compact_workspace_rows(k, max_bs, max_splits, programs):
    ws = k.dec.alloc_decode_workspace(max_bs, 2, 16, max_splits, DEV, programs=programs)
    bound = max_bs * max_splits if programs == 0 else min(max_bs + programs, max_bs * max_splits)
    assert ws.partial_out.shape == (bound, 2, 16) and ws.partial_lse.shape == (bound, 2, k.dec.MAX_DV_SPLIT)


def test_compact_workspace_size_at_128_seqs_128_heads(k):
    # target: <= 128 MB at 128 sequences x 128 heads (H100: 132 SMs, 2 head groups -> 66 programs)
    rows = k.dec.partial_rows(128, 32, 66)
    assert rows * 128 * 512 * 4 <= 128 * 2**20
    for dv_split, block_h in ((2, 64), (4, 64), (1, 32)):
        cfg = k.dec.decode_config(128, programs=132 // ((128 // block_h) * dv_split), dv_split=dv_split,
                                  block_h=block_h)
        assert k.dec.partial_rows(128, 32, cfg.programs) * 128 * 512 * 4 <= 128 * 2**20


# "fp8": the cache holds FP8 rows (cache.fp8_latent); the reference reads the same rows dequantized
CACHES = ["plain", "fp8"]


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("seq_lens", [[1], [3, 17, 64, 5], [40, 0, 16, 33], [0, 0], [20, 0, 0]])
def test_mla_decode_matches_reference(k, seq_lens, cache):
    out, _ = decode_case(k, seq_lens, heads=4, lora=32, rope=16, page=16, target=3, seed=len(seq_lens),
                         fp8=cache == "fp8")
    for b, n in enumerate(seq_lens):
        if n == 0:
            assert k.torch.equal(out[b], k.torch.zeros_like(out[b]))


@pytest.mark.parametrize("seq_lens", [[1000], [5, 300, 0], [64] * 6])
def test_split_cap_never_binds(k, seq_lens):
    """With ``split_cap(P)`` the plan's tiles per program is cdiv(T, P) alone (the cap adds nothing),
    no request has more splits than programs, and the workspace rows stay max_bs + P."""
    programs, bs = 7, len(seq_lens)
    ws = k.dec.alloc_decode_workspace(bs, 2, 16, k.dec.split_cap(programs), DEV, programs=programs)
    k.dec.build_decode_plan(upload(k, np.array(seq_lens, dtype=np.int32)), bs, ws, block_n=16, target_items=programs)
    tiles = [-(-n // 16) for n in seq_lens]
    assert int(ws.tiles_per_prog[0]) == max(-(-sum(tiles) // programs), 1)
    splits = ws.num_kv_splits[:bs]
    assert int(splits.max()) <= programs and int(splits.sum()) <= bs + programs - 1
    assert ws.partial_out.shape[0] == bs + programs


def test_mla_decode_one_row_over_more_splits_than_a_merge_chunk(k):
    # 300 tokens on 20 programs with the uncapped plan: one-tile splits (19 of 16 keys under the
    # interpreter), merged in two chunks of 16 there
    _, ws = decode_case(k, [300], heads=4, lora=32, rope=16, page=16, target=20, seed=2,
                         max_splits=k.dec.split_cap(20))
    assert int(ws.num_kv_splits[0]) == -(-300 // k.dec.decode_config(4, programs=20).block_n)


def test_mla_decode_many_splits_and_odd_dims(k):
    # 48 + 8: padded non-power-of-two dims; target 16 forces many splits per request (stage 2 merge)
    _, ws = decode_case(k, [70, 3], heads=3, lora=48, rope=8, page=16, target=16, seed=7)
    assert int(ws.num_kv_splits[0]) > 1


@pytest.mark.parametrize("variant", [{"dv_split": 2}, {"dv_split": 4}, {"block_h": 16, "dv_split": 2},
                                     {"dv_split": 2, "q_in_loop": 1}])
@pytest.mark.parametrize("seq_lens", [[3, 17, 64, 5], [70, 0, 2], [0, 0]])
def test_mla_decode_variants_match_reference(k, variant, seq_lens):
    """Each h=128 variant forced at small dims: value-column slices (QK over all dims, PV over a
    slice; one LSE per slice in the compact workspace) and smaller head blocks, many splits."""
    out, ws = decode_case(k, seq_lens, heads=8 if "block_h" not in variant else 24, lora=64, rope=16, page=16,
                           target=5, seed=3, **variant)
    for b, n in enumerate(seq_lens):
        if n == 0:
            assert k.torch.equal(out[b], k.torch.zeros_like(out[b]))
    if max(seq_lens) >= 64:
        assert int(ws.num_kv_splits[:len(seq_lens)].max()) > 1  # the stage-2 merge ran


def test_mla_decode_variants_deterministic_and_poisoned(k):
    """Same plan and inputs -> bitwise the same output, every element written (NaN-poisoned out),
    and the dv_split variant agrees with today's path to rounding."""
    torch = k.torch
    outs = {}
    for dv in (1, 2, 4):
        runs = [decode_case(k, [70, 9, 33], heads=8, lora=64, rope=16, page=16, target=4, seed=5, dv_split=dv)[0]
                for _ in range(2)]
        assert torch.equal(runs[0], runs[1])
        outs[dv] = runs[0]
    torch.testing.assert_close(outs[2], outs[1], atol=TOL, rtol=TOL)
    torch.testing.assert_close(outs[4], outs[1], atol=TOL, rtol=TOL)


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("qg", [1, 2, 4, 8])
def test_mla_decode_query_groups_match_per_token_reference(k, qg, cache):
    """Query groups (short extend rows): the last q tokens of each sequence, qg consecutive tokens per
    plan row, each token with its own causal length, equal the reference run one row per token. One
    tile per program puts split boundaries between a group's lengths (a token sees no key in a split)."""
    torch = k.torch
    rng = np.random.default_rng(qg)
    heads, lora, rope, page = 4, 32, 16, 16
    seqs = [(65, 7), (20, 3), (33, 1), (5, 5), (64, 9)]            # (length after the step, new tokens)
    bt, nb = random_block_tables(rng, [n for n, _ in seqs], page)
    lk = lora + rope
    kv = paged_cache(k, rng, nb, page, lk, fp8=cache == "fp8")
    tok_seq, tok_len, g_seq, g_row0, g_ntok, g_len = [], [], [], [], [], []
    for s, (n, q) in enumerate(seqs):
        for first in range(0, q, qg):
            nt = min(qg, q - first)
            g_seq.append(s), g_row0.append(len(tok_seq)), g_ntok.append(nt), g_len.append(n - q + first + nt)
            for t in range(first, first + nt):
                tok_seq.append(s), tok_len.append(n - q + t + 1)
    T, G = len(tok_seq), len(g_seq)
    q = upload(k, rng.standard_normal((T, heads, lk)).astype(np.float32))
    i32 = lambda a: upload(k, np.array(a, dtype=np.int32))  # noqa: E731
    groups = k.dec.QueryGroups(i32(g_row0), i32(g_ntok), qg, G)
    cfg = k.dec.decode_config(qg * heads, programs=16, min_tiles=1)
    ws = k.dec.alloc_decode_workspace(G, qg * heads, lora, 16, DEV, programs=16)
    lens = i32(g_len)
    k.dec.build_decode_plan(lens, G, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
    out = torch.full((T, heads, lora), float("nan"), device=DEV)
    k.dec.mla_decode(q, kv, upload(k, bt[g_seq]), lens, out, ws, lora, lk ** -0.5, cfg, groups)
    expect = k.ref.mla_decode_ref(q, kv, upload(k, bt[tok_seq]), i32(tok_len), lora, lk ** -0.5)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, expect, atol=TOL, rtol=TOL)
    assert int(ws.num_kv_splits[:G].max()) > 1   # the stage-2 merge ran


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("case", ["no_cache", "all_cached", "mixed", "zeros"])
def test_read_cache_and_interleave_bitwise(k, case, cache):
    """The extend's gather: per request its cached rows, then its new rows. A bf16/fp32 gather takes
    the new rows from `new` (their cache slots keep random rows, so reading them from the cache would
    fail); over an FP8 cache the step's rows are written first, as the backends do, and every row is
    read back from it (dequantized), so a prompt sees the same rounded keys whether it was cached,
    chunked or new."""
    torch, fp8 = k.torch, cache == "fp8"
    rng = np.random.default_rng(11)
    q_lens, c_lens = {
        "no_cache": ([5, 3], [0, 0]),
        "all_cached": ([0, 0, 0], [17, 4, 32]),
        "mixed": ([4, 1, 0, 7], [20, 0, 9, 16]),
        "zeros": ([0, 2, 0], [0, 0, 0]),
    }[case]
    k_lens = [a + b for a, b in zip(q_lens, c_lens)]
    page, d = 16, 40
    bt, nb = random_block_tables(rng, k_lens, page)
    kv = paged_cache(k, rng, nb, page, d, fp8)
    new = upload(k, rng.standard_normal((sum(q_lens), d)).astype(np.float32))
    slots = [int(bt[b][i // page]) * page + i % page for b in range(len(q_lens)) for i in range(c_lens[b], k_lens[b])]
    if fp8:
        k.cw.write_latent_cache(new, kv, upload(k, np.array(slots, dtype=np.int64)))
    cu_q = upload(k, np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32))
    cu_k = upload(k, np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32))
    total = int(sum(k_lens))
    got = k.il.read_cache_and_interleave(kv, upload(k, bt), new, cu_q, cu_k, total)
    expect = k.ref.read_cache_and_interleave_ref(kv, upload(k, bt), new, cu_q, cu_k, total)
    assert got.shape == (total, d) and got.dtype == new.dtype and torch.equal(got, expect)
    # the new rows land after each request's cached rows: unchanged, or FP8-rounded from an FP8 cache
    kept = k.f8.dequantize(k.f8.quantize(new), d) if fp8 else new
    o = 0
    for b in range(len(q_lens)):
        qs = sum(q_lens[:b])
        assert torch.equal(got[o + c_lens[b]:o + k_lens[b]], kept[qs:qs + q_lens[b]])
        o += k_lens[b]


@pytest.mark.parametrize("dqk,dv", [(48, 32), (24, 20)])
def test_prefill_with_cached_prefix(k, dqk, dv):
    torch = k.torch
    rng = np.random.default_rng(dqk)
    q_lens, c_lens = [5, 1, 0, 20], [0, 9, 4, 13]
    k_lens = [a + b for a, b in zip(q_lens, c_lens)]
    h = 2
    q = upload(k, rng.standard_normal((sum(q_lens), h, dqk)).astype(np.float32))
    kk = upload(k, rng.standard_normal((sum(k_lens), h, dqk)).astype(np.float32))
    v = upload(k, rng.standard_normal((sum(k_lens), h, dv)).astype(np.float32))
    cu_q = upload(k, np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32))
    cu_k = upload(k, np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32))
    scale = dqk ** -0.5
    got = k.pf.prefill_attention(q, kk, v, cu_q, cu_k, max(q_lens), scale)
    expect = k.ref.prefill_ref(q, kk, v, cu_q, cu_k, scale)
    torch.testing.assert_close(got, expect, atol=TOL, rtol=TOL)
    # a request with no cache is plain causal attention: its first token sees only itself
    torch.testing.assert_close(got[0], v[0], atol=TOL, rtol=TOL)
