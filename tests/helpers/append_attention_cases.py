"""Random paged inputs for the ``append_attention`` op tests (CPU op vs reference, CUDA op vs both).

A case is a batch of requests (cached prefix, new tokens). ``run_case`` makes two calls with one
implementation, as the engine does: the first appends every prefix (a prefill step), the second
appends the new tokens (chunks, decodes, zero-length rows, padding tokens past cu_seqlens_q[B]) and
attends over cached + new keys. With head-wise tables and SWA heads, the blocks that no query of
the second call may see are taken out of the SWA heads' rows (-1) and poisoned with NaN in the
cache, so any read of them shows up in the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paddle_mla.platform.tensor_api import torch
from paddle_mla.attention.gqa_reference import append_attention_reference


@dataclass(frozen=True)
class Case:
    reqs: tuple[tuple[int, int], ...]     # (cached prefix, new tokens) per request
    hq: int
    hkv: int
    head_dim: int
    rot_dim: int
    neox: bool
    block_size: int
    head_wise: bool = False
    swa: tuple[int, int, int] = (0, 0, 0)  # (num_swa_heads, window, sink)
    pad: int = 0                           # padding tokens past cu_seqlens_q[B] in the second call
    seed: int = 0


def rope_table(max_pos: int, rot_dim: int, theta: float = 10000.0) -> np.ndarray:
    inv = 1.0 / theta ** (np.arange(0, rot_dim, 2) / rot_dim)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], -1).astype(np.float32)


@dataclass
class CaseData:
    tables: np.ndarray
    Q: list
    K: list
    V: list
    cos_sin: np.ndarray
    num_blocks: int
    poison: list          # (head, block) pairs taken out of SWA rows before the second call


def make_data(c: Case) -> CaseData:
    rng = np.random.default_rng(c.seed)
    B = len(c.reqs)
    total = [a + n for a, n in c.reqs]
    per_req = max(1, -(-max(total) // c.block_size))
    num_blocks = per_req * B + 3
    if c.head_wise:   # each KV head its own permutation of physical blocks
        tables = np.stack([rng.permutation(num_blocks)[:per_req * B].reshape(B, per_req) for _ in range(c.hkv)], 1)
    else:
        tables = rng.permutation(num_blocks)[:per_req * B].reshape(B, per_req)
    tables = tables.astype(np.int32)
    n_swa, window, sink = c.swa
    poison = []
    if c.head_wise and n_swa:
        for r, (cached, n) in enumerate(c.reqs):
            for blk in range(per_req):
                lo, hi = blk * c.block_size, (blk + 1) * c.block_size - 1
                if n and lo >= sink and hi <= cached - window:
                    for g in range(c.hkv - n_swa, c.hkv):
                        poison.append((r, g, blk, int(tables[r, g, blk])))
    mk = lambda t, h: rng.standard_normal((t, h, c.head_dim)).astype(np.float32)  # noqa: E731
    return CaseData(tables, [mk(t, c.hq) for t in total], [mk(t, c.hkv) for t in total],
                    [mk(t, c.hkv) for t in total], rope_table(max(total) + 4, c.rot_dim), num_blocks, poison)


def step_inputs(c: Case, data: CaseData, spans, pad: int):
    """Host arrays of one call; spans: (start, length) of each request's tokens this call."""
    q_lens = np.array([n for _, n in spans], dtype=np.int32)

    def take(X):
        parts = [X[r][s:s + n] for r, (s, n) in enumerate(spans)]
        return np.concatenate(parts + [np.zeros((pad,) + X[0].shape[1:], np.float32)])

    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    bid = np.concatenate([np.repeat(np.arange(len(spans)), q_lens), np.zeros(pad)]).astype(np.int32)
    pos = np.concatenate([np.arange(s, s + n) for s, n in spans] + [np.zeros(pad)]).astype(np.int64)
    k_lens = np.array([s + n for s, n in spans], dtype=np.int32)
    return take(data.Q), take(data.K), take(data.V), cu, k_lens, bid, pos


def run_case(c: Case, fn, dtype, device: str, data: CaseData | None = None, flat_bases=None, **extra):
    """Both calls through ``fn`` (the op or the reference); returns (out of the second call, k_cache,
    v_cache) as float32 numpy arrays. ``flat_bases`` (head-wise cases): per-head ranges of one flat
    [total, bs, D] cache, head g's local id i being global id flat_bases[g] + i; the caches come back
    as [Hkv, num_blocks, bs, D] (each head's range cut out), comparable with the head-major layout."""
    data = data or make_data(c)
    n_swa, window, sink = c.swa
    kw = dict(softmax_scale=c.head_dim ** -0.5 * 1.1, neox=c.neox, rot_dim=c.rot_dim, num_swa_heads=n_swa,
              window=window, sink=sink, **extra)
    shape = (c.hkv, data.num_blocks, c.block_size, c.head_dim)
    tables = data.tables.copy()
    if flat_bases is not None:
        assert c.head_wise and len(flat_bases) == c.hkv
        total = max(flat_bases) + data.num_blocks
        shape = (total, c.block_size, c.head_dim)
        bases = np.asarray(flat_bases, dtype=np.int32)[None, :, None]
        tables = np.where(tables >= 0, tables + bases, -1).astype(np.int32)
    kc = torch.zeros(shape, dtype=dtype).to(device)
    vc = torch.zeros(shape, dtype=dtype).to(device)
    slot = (lambda g, phys: (g, phys)) if flat_bases is None else (lambda g, phys: flat_bases[g] + phys)  # noqa: E731
    dev = lambda a, dt=None: torch.from_numpy(np.ascontiguousarray(a)).to(device) if dt is None else \
        torch.from_numpy(np.ascontiguousarray(a)).to(dt).to(device)  # noqa: E731
    out = None
    for call, spans, pad in ((0, [(0, a) for a, _ in c.reqs], 0), (1, [(a, n) for a, n in c.reqs], c.pad)):
        if call == 1:
            for r, g, blk, phys in data.poison:
                tables[r, g, blk] = -1
                kc[slot(g, phys)] = float("nan")
                vc[slot(g, phys)] = float("nan")
        q, k, v, cu, k_lens, bid, pos = step_inputs(c, data, spans, pad)
        out = torch.full(q.shape, float("nan"), dtype=dtype).to(device)
        lens = (cu, k_lens) if fn is append_attention_reference else (dev(cu), dev(k_lens))   # the reference: host
        fn(dev(q, dtype), dev(k, dtype), dev(v, dtype), kc, vc, dev(tables), *lens, dev(bid), dev(pos),
           dev(data.cos_sin), out, **kw)
    kc, vc = kc.to(torch.float32).cpu().numpy(), vc.to(torch.float32).cpu().numpy()
    if flat_bases is not None:
        kc, vc = (np.stack([x[b:b + data.num_blocks] for b in flat_bases]) for x in (kc, vc))
    return out.to(torch.float32).cpu().numpy(), kc, vc


def check_decode_graph_replay(device: str, B: int, hq: int, hkv: int, d: int, bs: int, M: int, length_sets,
                              head_wise: bool = False, seed: int = 0, **swa) -> None:
    """One bf16 decode step of B rows (one new token each, lengths 1) captured in a CUDA graph, then
    for each list of ``length_sets`` replayed with those lengths and new queries and keys: the
    output and the caches equal an eager call's on copies of the caches. ``head_wise``: each KV
    head its own random block order; ``swa``: num_swa_heads, window, sink."""
    from paddle_mla.ops import append_attention as op

    g = torch.Generator(device="cpu").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device, torch.bfloat16)  # noqa: E731
    kc, vc = rnd(hkv, B * M, bs, d), rnd(hkv, B * M, bs, d)
    if head_wise:
        perm = torch.stack([torch.randperm(B * M, generator=g) for _ in range(hkv)], 1)   # [B * M, hkv]
        tables = perm.reshape(B, M, hkv).permute(0, 2, 1).contiguous().to(device, torch.int32)
    else:
        tables = torch.arange(B * M, dtype=torch.int32, device=device).reshape(B, M)
    cu = torch.arange(B + 1, dtype=torch.int32, device=device)
    ids = torch.arange(B, dtype=torch.int32, device=device)
    lens = torch.ones(B, dtype=torch.int32, device=device)
    pos = torch.zeros(B, dtype=torch.int64, device=device)
    q, k, v = rnd(B, hq, d), rnd(B, hkv, d), rnd(B, hkv, d)
    cs = torch.randn(bs * M, d, generator=g).to(device)
    out = torch.empty_like(q)
    ws = torch.empty(op.workspace_numel(B, hq, d), dtype=torch.float32, device=device)
    kw = dict(softmax_scale=d ** -0.5, neox=True, rot_dim=d, workspace=ws, decode_only=True, **swa)

    def call(kc_, vc_, out_):
        return op.append_attention(q, k, v, kc_, vc_, tables, cu, lens, ids, pos, cs, out_, **kw)

    call(kc, vc, out)   # warm-up (lazy build, shared-memory attributes) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(kc, vc, out)
    for new_lens in length_sets:
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        pos.copy_(torch.tensor(new_lens, dtype=torch.int64) - 1)
        q.copy_(rnd(B, hq, d))
        k.copy_(rnd(B, hkv, d))
        kc2, vc2, want = kc.clone(), vc.clone(), torch.empty_like(out)
        call(kc2, vc2, want)
        graph.replay()
        torch.cuda.synchronize()
        np.testing.assert_allclose(out.float().cpu().numpy(), want.float().cpu().numpy(), atol=1e-2, rtol=1e-2)
        assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def gpu() -> str:
    """The GPU's device string in the selected runtime."""
    from paddle_mla.platform import runtime

    return runtime.device_string("gpu")


def compare_outputs(got, want, tol: float) -> None:
    """Two ``run_case`` results, (out, k_cache, v_cache), each within ``tol`` (NaN only where both are)."""
    for name, g, w in zip(("out", "k_cache", "v_cache"), got, want):
        np.testing.assert_allclose(g, w, atol=tol, rtol=tol, equal_nan=True, err_msg=name)
