"""Split mixed batches in ``triton_mla``: decode rows through the decode kernel, extend rows over
their own context only, chunk-wise through a bounded workspace with log-sum-exp merging.

Oracles: the ``native`` backend and the plain references of ``triton_mla/reference.py``. Tiny
shapes, float32, under TRITON_INTERPRET=1 on the CPU (torch runtime) or on a GPU.
"""

import numpy as np
import pytest
from helpers.mixed_batch_cases import make_case, plain_reference, run_backend
from helpers.triton_kernel_helpers import device_and_tolerance, kernel_namespace, random_block_tables

pytestmark = pytest.mark.triton

DEV, TOL = device_and_tolerance()

# three decodes (one at a page boundary), then extend rows: a chunk over a long cached prefix, a
# one-token extend row, a fresh prompt, another continuation
MIXED = [(37, 1), (16, 1), (70, 1), (50, 9), (20, 1), (0, 13), (33, 6)]


@pytest.fixture(scope="module")
def k():
    return kernel_namespace(DEV)


def _t(k, a):
    return k.torch.from_numpy(np.ascontiguousarray(a)).to(DEV)


@pytest.mark.parametrize("chunk", [5, 16, 1000])
def test_extend_attention_in_chunks_matches_one_pass(k, chunk):
    """Keys fed chunk by chunk (workspace row 0 = packed row k_start) and merged by LSE equal the
    dense reference, and the LSE left behind is the log2-sum-exp of each row's visible scores."""
    torch = k.torch
    rng = np.random.default_rng(chunk)
    q_lens, c_lens = [5, 1, 0, 20, 3], [0, 9, 4, 13, 40]
    k_lens = [a + b for a, b in zip(q_lens, c_lens)]
    h, da, db, dv = 2, 16, 8, 20
    q = _t(k, rng.standard_normal((sum(q_lens), h, da + db)).astype(np.float32))
    kk = _t(k, rng.standard_normal((sum(k_lens), h, da + db)).astype(np.float32))
    v = _t(k, rng.standard_normal((sum(k_lens), h, dv)).astype(np.float32))
    cu_q = _t(k, np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32))
    cu_k = _t(k, np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32))
    scale = 0.3
    out = torch.full((sum(q_lens), h, dv), float("nan"), device=DEV)
    lse = torch.full((sum(q_lens), h), float("nan"), device=DEV)
    total = sum(k_lens)
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        k.pf.extend_attention(q[:, :, :da], q[:, :, da:], kk[start:start + n, :, :da], kk[start:start + n, :, da:],
                              v[start:start + n], out, lse, cu_q, cu_k, max(q_lens), scale, k_start=start, k_rows=n,
                              merge=start > 0)
    expect = k.ref.prefill_ref(q, kk, v, cu_q, cu_k, scale)
    torch.testing.assert_close(out, expect, atol=TOL, rtol=TOL)
    # LSE (log2 domain) of row i of request b over its keys at positions <= its own
    for b in range(len(q_lens)):
        for i in range(q_lens[b]):
            row, kq = int(sum(q_lens[:b])) + i, int(sum(k_lens[:b]))
            vis = kk[kq:kq + c_lens[b] + i + 1]
            s = torch.einsum("hd,khd->hk", q[row], vis) * scale
            torch.testing.assert_close(lse[row], torch.logsumexp(s, -1) / np.log(2), atol=TOL, rtol=TOL)


def test_interleave_windows_tile_the_full_sequence(k):
    """Windows [k_start, k_start + n) of the packed sequence, also through cu/table views that start
    at a later request, are bitwise the rows of the whole read."""
    torch = k.torch
    rng = np.random.default_rng(3)
    q_lens, c_lens = [1, 1, 4, 0, 7], [30, 5, 20, 9, 16]
    k_lens = [a + b for a, b in zip(q_lens, c_lens)]
    page, d = 8, 24
    bt, nb = random_block_tables(rng, k_lens, page)
    cache = _t(k, rng.standard_normal((nb, page, 1, d)).astype(np.float32))
    new = _t(k, rng.standard_normal((sum(q_lens), d)).astype(np.float32))
    cu_q = _t(k, np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32))
    cu_k = _t(k, np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32))
    tables = _t(k, bt)
    whole = k.ref.read_cache_and_interleave_ref(cache, tables, new, cu_q, cu_k, sum(k_lens))
    for first_row in (0, 2):
        lo = sum(k_lens[:first_row])
        for start in range(lo, sum(k_lens), 11):
            n = min(11, sum(k_lens) - start)
            args = (cache, tables[first_row:], new, cu_q[first_row:], cu_k[first_row:], n)
            got = k.il.read_cache_and_interleave(*args, k_start=start)
            assert torch.equal(got, whole[start:start + n])
            assert torch.equal(k.ref.read_cache_and_interleave_ref(*args, k_start=start), got)


@pytest.mark.parametrize("chunk", [9, 0])
@pytest.mark.parametrize("short", [-1, 0, 7])
def test_mixed_batch_matches_native_and_reference(k, chunk, short):
    """Decodes + extend rows with cached prefixes spanning several workspace chunks (chunk 0: the
    default, the whole step in one chunk)."""
    torch = k.torch
    case = make_case(MIXED, page=8, device=DEV, dtype=torch.float32, seed=chunk)
    got, cache, meta = run_backend("triton_mla", case, DEV, extend_chunk_tokens=chunk, short_extend_tokens=short)
    native, native_cache, _ = run_backend("native", case, DEV)
    assert meta.num_decode_reqs == 3 and not meta.is_decode_only
    assert torch.equal(cache, native_cache)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, native, atol=TOL, rtol=TOL)
    torch.testing.assert_close(got, plain_reference(case, cache, meta), atol=TOL, rtol=TOL)


def test_decode_rows_are_never_expanded(k, monkeypatch):
    """The extend path reads exactly the extend rows' packed keys, in windows of at most the
    chunk size; the decode kernel gets exactly the decode rows, with their plan from prepare."""
    from paddle_mla.attention.triton_mla import backend as tb
    from paddle_mla.attention.triton_mla import extend

    windows, decode_rows, plans = [], [], []
    read = extend.read_cache_and_interleave
    monkeypatch.setattr(extend, "read_cache_and_interleave",
                        lambda *a, **kw: windows.append((kw["k_start"], a[5])) or read(*a, **kw))
    decode = tb.mla_decode
    monkeypatch.setattr(tb, "mla_decode", lambda q, *a: decode_rows.append(q.shape[0]) or decode(q, *a))
    plan = tb.build_decode_plan
    monkeypatch.setattr(tb, "build_decode_plan", lambda lens, bs, *a: plans.append(bs) or plan(lens, bs, *a))
    case = make_case(MIXED, page=8, device=DEV, dtype=k.torch.float32, seed=1)
    run_backend("triton_mla", case, DEV, extend_chunk_tokens=16, short_extend_tokens=0)
    decode_keys = sum(c + n for c, n in MIXED[:3])
    all_keys = sum(c + n for c, n in MIXED)
    assert windows[0][0] == decode_keys and all(n <= 16 for _, n in windows)
    assert [s for s, _ in windows] == list(range(decode_keys, all_keys, 16))
    assert sum(n for _, n in windows) == all_keys - decode_keys
    assert decode_rows == [3] and plans == [3]


@pytest.mark.parametrize("rows", [
    [(0, 12), (5, 3)],                   # extend rows only
    [(9, 1), (4, 1)],                    # decodes only, one of them a 1-token prompt tail: not decode-only
    [(0, 1), (30, 1), (0, 5)],           # a one-token prompt first: it leads the decode rows
])
def test_edge_batches_match_native(k, rows):
    torch = k.torch
    case = make_case(rows, page=4, device=DEV, dtype=torch.float32, seed=len(rows))
    if rows == [(9, 1), (4, 1)]:
        case.batch.is_prefill[1] = True
    got, _, meta = run_backend("triton_mla", case, DEV, extend_chunk_tokens=6)
    native, _, _ = run_backend("native", case, DEV)
    assert not meta.is_decode_only
    torch.testing.assert_close(got, native, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("absorb_short", [False, True])
def test_engine_chunked_prefix_greedy_tokens_match_native(monkeypatch, absorb_short):
    """The engine with chunked prefill (budget 12) and prefix caching, extend chunks of 12 rows:
    shared prefixes of 32 tokens are read back across several chunks while other requests decode
    in the same steps; greedy tokens equal native's. ``absorb_short``: short extend rows (the
    dims' crossover) run as pseudo decode rows; otherwise every extend row is expanded."""
    import random

    from test_engine_equivalence import BLOCK, make_llm

    from paddle_mla.attention.triton_mla import extend
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    monkeypatch.setattr(extend, "CHUNK_TOKENS_MIN", 12)

    over = {"cache": {"enable_prefix_caching": True}, "device": "cpu" if DEV == "cpu" else "gpu",
            "scheduler": {"enable_chunked_prefill": True, "max_num_batched_tokens": 12, "max_num_seqs": 3}}
    native = make_llm(**over)
    rng = random.Random(7)
    vocab = native.runner.arch.vocab_size
    shared = [rng.randrange(3, vocab) for _ in range(4 * BLOCK + 2)]
    reqs = [GenerationRequest(id=i, prompt_token_ids=shared + [rng.randrange(3, vocab) for _ in range(3 + 5 * i)],
                              params=SamplingParams(max_tokens=4, ignore_eos=True)) for i in range(3)]
    expected = [o.token_ids for o in native.generate(reqs, use_tqdm=False)]
    llm = make_llm(attention={"backend": "triton_mla"}, **over)
    if not absorb_short:
        llm.runner.backend.short_max_q = 0
    steps, pseudo = [], []
    prepare = llm.runner.backend.prepare

    def recording(meta):
        prepare(meta)
        plan = meta.attn.extend_plan
        steps.append((meta.num_decode_reqs if plan else 0, plan.k_end - plan.k_begin if plan else 0))
        split = meta.attn.short_split
        pseudo.append((meta.num_decode_reqs, split.rows) if split else (0, 0))

    llm.runner.backend.prepare = recording
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.token_ids for o in outs] == expected
    assert llm.stats().cached_prompt_tokens == 2 * 4 * BLOCK
    if absorb_short:
        # steps that mixed decodes with short extend rows over cached prefixes, run absorbed
        assert any(nd > 0 and rows > 0 for nd, rows in pseudo), pseudo
    else:
        # steps that mixed decodes with extend rows whose context spans several 12-row chunks
        assert any(nd > 0 and keys > 2 * 12 for nd, keys in steps), steps


# decodes, short extends over long cached prefixes (leading run), a long chunk (expanded), short
# extends at the tail; the middle short row stays expanded
SHORT = [(61, 1), (8, 1), (75, 3), (90, 1), (40, 30), (66, 9), (120, 4), (83, 5)]


@pytest.mark.parametrize("chunk", [16, 0])
def test_short_extends_run_absorbed_and_match_native(k, monkeypatch, chunk):
    """Short extend rows become pseudo decode rows (one per new token, causal seq len); only the
    long row's keys are expanded; outputs equal native and the plain reference."""
    from paddle_mla.attention.triton_mla import backend as tb
    from paddle_mla.attention.triton_mla import extend, short_extend

    torch = k.torch
    windows, decode_rows = [], []
    read = extend.read_cache_and_interleave
    monkeypatch.setattr(extend, "read_cache_and_interleave",
                        lambda *a, **kw: windows.append((kw["k_start"], a[5])) or read(*a, **kw))
    decode = tb.mla_decode
    for module in (tb, short_extend):      # the decode rows, then the pseudo rows
        monkeypatch.setattr(module, "mla_decode", lambda q, *a: decode_rows.append(q.shape[0]) or decode(q, *a))
    case = make_case(SHORT, page=8, device=DEV, dtype=torch.float32, seed=chunk)
    got, cache, meta = run_backend("triton_mla", case, DEV, extend_chunk_tokens=chunk, short_extend_tokens=5)
    native, _, _ = run_backend("native", case, DEV)
    split = meta.attn.short_split
    assert (split.lead_begin, split.lead_end, split.tail_begin) == (2, 4, 6)
    assert decode_rows == [2, 3 + 1 + 4 + 5]
    k_lo = sum(c + n for c, n in SHORT[:4])
    assert windows[0][0] == k_lo and sum(n for _, n in windows) == sum(c + n for c, n in SHORT[4:6])
    torch.testing.assert_close(got, native, atol=TOL, rtol=TOL)
    torch.testing.assert_close(got, plain_reference(case, cache, meta), atol=TOL, rtol=TOL)


def test_short_split_respects_row_cap():
    from paddle_mla.attention.triton_mla.short_extend import crossover_tokens, split_short_rows
    from paddle_mla.attention.backend import MLADims

    v3 = MLADims(num_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                 softmax_scale=0.1)
    assert crossover_tokens(v3) == 170
    q = np.array([1, 1, 64, 64, 900, 64, 64], dtype=np.int32)
    s = split_short_rows(q, 2, 170, 150)
    assert (s.lead_end, s.tail_begin, s.rows) == (4, 7, 128)
    s = split_short_rows(q, 2, 170, 200)
    assert (s.lead_end, s.tail_begin, s.rows) == (4, 6, 192)
    # groups of 4 tokens: 16 per 64-token row; the group cap binds before the token cap
    s = split_short_rows(q, 2, 170, 1000, qg=4, max_groups=40)
    assert (s.lead_end, s.tail_begin, s.rows, s.groups) == (4, 7, 128, 32)
    s = split_short_rows(np.array([1, 3, 5, 64], dtype=np.int32), 1, 170, 1000, qg=4, max_groups=20)
    assert (s.lead_end, s.tail_begin, s.rows, s.groups) == (4, 4, 72, 1 + 2 + 16)


# short extends longer than one query group (16 tokens at 4 heads) over long cached prefixes, one
# row cut by the step's end of a chunk boundary: several groups per row, the last one partial
LONG_SHORT = [(40, 1), (90, 20), (75, 33), (10, 16), (64, 17)]


def test_short_extends_in_several_query_groups_match_native(k):
    torch = k.torch
    case = make_case(LONG_SHORT, page=8, device=DEV, dtype=torch.float32, seed=11)
    got, cache, meta = run_backend("triton_mla", case, DEV, short_extend_tokens=40)
    native, _, _ = run_backend("native", case, DEV)
    split = meta.attn.short_split
    assert split.rows == 20 + 33 + 16 + 17 and split.groups == 2 + 3 + 1 + 2
    torch.testing.assert_close(got, native, atol=TOL, rtol=TOL)
    torch.testing.assert_close(got, plain_reference(case, cache, meta), atol=TOL, rtol=TOL)


def test_deterministic_pseudo_rows_in_chunks_give_the_same_bits(k, monkeypatch):
    """``deterministic: true`` sizes the pseudo rows' partials by max_model_len, so their groups go
    through the decode kernel in chunks that fit the workspace cap: several chunks give the bits of
    one launch, and native's answer."""
    from paddle_mla.attention.triton_mla import short_extend

    torch = k.torch
    # every row's tokens are outputs (prompt length = cached count: a preempted request recomputing)
    case = make_case(LONG_SHORT, page=8, device=DEV, dtype=torch.float32, seed=5,
                     prompt_lens=[c for c, _ in LONG_SHORT])
    whole, cache, meta = run_backend("triton_mla", case, DEV, deterministic=True)
    split = meta.attn.short_split
    assert split.groups == 2 + 3 + 1 + 2     # every output token absorbed in this mode, 16 a group
    built = []
    init = short_extend.PseudoRows.__init__
    monkeypatch.setattr(short_extend.PseudoRows, "__init__",
                        lambda self, *a, **kw: init(self, *a, **kw) or built.append(self))
    # a group's partials as if max_model_len were long: two groups fill the workspace cap
    monkeypatch.setattr(short_extend, "fixed_split_group_bytes", lambda *a: short_extend.PSEUDO_WORKSPACE_BYTES // 2)
    launches = []
    decode = short_extend.mla_decode
    monkeypatch.setattr(short_extend, "mla_decode", lambda *a: launches.append(a[-1].count) or decode(*a))
    chunked, _, _ = run_backend("triton_mla", case, DEV, deterministic=True)
    (p,) = built
    assert p.chunk == 2 and launches == [2, 2, 2, 2]     # this step: 8 groups in 4 launches
    assert all(ws.partial_out is p.ws.partial_out for ws in p.chunk_ws)
    assert torch.equal(chunked, whole)
    native, _, _ = run_backend("native", case, DEV)
    torch.testing.assert_close(whole, native, atol=TOL, rtol=TOL)
