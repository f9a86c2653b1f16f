"""Shared by the MLA kernel tests (CPU interpreter and GPU, Triton and the CUDA op): the kernel modules
in one namespace, paged block tables in random physical order, paged caches (plain or FP8 rows), the
Triton decode case against its reference, uploads, the closeness check against a reference, and
repeated runs into a NaN-poisoned output that must agree bitwise."""

from types import SimpleNamespace

import numpy as np


def device_and_tolerance() -> tuple[str, float]:
    """Where the Triton kernel tests that run on both run, and their tolerance: the GPU when there
    is one (tf32 dots: 3e-2), else the CPU interpreter (float32 dots, exact-ish: 2e-4)."""
    from paddle_mla.platform import runtime

    dev = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")
    return dev, tolerance(dev)


def tolerance(dev: str) -> float:
    return 2e-4 if dev == "cpu" else 3e-2


def kernel_namespace(device: str) -> SimpleNamespace:
    from paddle_mla.attention.triton_mla import cache_write, decode, interleave, prefill, reference
    from paddle_mla.cache import fp8_latent
    from paddle_mla.platform.tensor_api import torch

    return SimpleNamespace(torch=torch, ref=reference, cw=cache_write, dec=decode, il=interleave, pf=prefill,
                           f8=fp8_latent, dev=device)


def cuda_mla_namespace(op: str) -> SimpleNamespace:
    """kernel_namespace on the GPU with ``cd`` = attention.triton_mla.cuda_decode, or a pytest skip
    naming why the SM90 MLA CUDA ops (``op``) cannot run here."""
    import pytest

    from paddle_mla.attention.triton_mla import cuda_decode
    from paddle_mla.platform import runtime

    ns = kernel_namespace(runtime.device_string("gpu"))
    why = cuda_decode.unavailable_reason(512, 576, ns.torch.bfloat16, ns.dev)
    if why:
        pytest.skip(f"{op} CUDA op unavailable: {why}")
    ns.cd = cuda_decode
    return ns


def launch_overrides(key) -> dict:
    """A launch-config key of ops.mla_decode, (row_blocks, col_splits, block_n, stages), as CudaDecode's
    keyword overrides."""
    return dict(zip(("row_blocks", "col_splits", "block_n", "stages"), key))


def random_block_tables(rng, seq_lens, page: int, extra_blocks: int = 3):
    """(tables int32 [B, max_blocks + 1], -1 padded, num_blocks) with blocks in random physical order."""
    need = [max(1, -(-int(s) // page)) for s in seq_lens]
    nb = sum(need) + extra_blocks
    perm = rng.permutation(nb)
    bt = np.full((len(seq_lens), max(need) + 1), -1, dtype=np.int32)
    pos = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[pos:pos + n]
        pos += n
    return bt, nb


def upload(k: SimpleNamespace, a):
    return k.torch.from_numpy(np.ascontiguousarray(a)).to(k.dev)


def paged_cache(k: SimpleNamespace, rng, nb: int, page: int, width: int, fp8: bool = False):
    """[nb, page, 1, width] random float32 latent rows, or the same rows as FP8 rows (the reference
    codec's, ``cache.fp8_latent``): the same draws either way."""
    rows = upload(k, rng.standard_normal((nb * page, width)).astype(np.float32))
    if fp8:
        return k.f8.quantize(rows).view(nb, page, 1, k.f8.row_width(width))
    return rows.view(nb, page, 1, width)


def decode_case(k: SimpleNamespace, seq_lens, heads, lora, rope, page, target, seed, max_splits=16, fp8=False,
                **variant):
    """The Triton split-KV decode (``decode_config`` with ``variant``, ``target`` programs) over a random
    paged cache against ``mla_decode_ref``, every element written: (out, workspace)."""
    torch, dev = k.torch, k.dev
    tol = tolerance(dev)
    rng = np.random.default_rng(seed)
    bt, nb = random_block_tables(rng, seq_lens, page)
    bs, lk = len(seq_lens), lora + rope
    cache = paged_cache(k, rng, nb, page, lk, fp8)
    q = upload(k, rng.standard_normal((bs, heads, lk)).astype(np.float32))
    lens, tables = upload(k, np.array(seq_lens, dtype=np.int32)), upload(k, bt)
    cfg = k.dec.decode_config(heads, programs=target, **variant)
    ws = k.dec.alloc_decode_workspace(bs + 1, heads, lora, max_splits, dev, programs=target)
    k.dec.build_decode_plan(lens, bs, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
    out = torch.full((bs, heads, lora), float("nan"), device=dev)
    k.dec.mla_decode(q, cache, tables, lens, out, ws, lora, lk ** -0.5, cfg)
    expect = k.ref.mla_decode_ref(q, cache, tables, lens, lora, lk ** -0.5)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, expect, atol=tol, rtol=tol)
    return out, ws


def check_close(k: SimpleNamespace, got, ref) -> None:
    """Every element written, max abs error < 5e-2, relative L2 < 1e-2, cosine > 1 - 1e-3."""
    torch = k.torch
    g, r = got.float().flatten(), ref.float().flatten()
    assert not torch.isnan(g).any()
    assert float((g - r).abs().max()) < 5e-2
    if float(r.norm()) > 0:
        assert float((g - r).norm() / r.norm()) < 1e-2
        assert float(torch.nn.functional.cosine_similarity(g[None], r[None])[0]) > 1 - 1e-3


def poisoned_runs(k: SimpleNamespace, fn, out, runs: int = 5):
    """Run ``fn`` ``runs`` times into ``out`` filled with NaN first: every element must be written and
    every run bitwise equal to the first (returned)."""
    results = []
    for _ in range(runs):
        out.fill_(float("nan"))
        fn()
        assert not k.torch.isnan(out).any(), "an output element was not written"
        results.append(out.clone())
    for r in results[1:]:
        assert k.torch.equal(r, results[0]), "not bitwise deterministic"
    return results[0]


def check_graph_replay(k: SimpleNamespace, step, q, cache, tables, lens, out, lora: int, scale: float) -> None:
    """Capture ``step`` (plan + decode into ``out``) in a CUDA graph, then replay it after writing new
    lengths into ``lens`` (longer, shorter, empty rows): each replay must match the plain reference."""
    torch = k.torch
    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for new_lens in ([1, 4096, 0, 700], [2000, 3, 64, 65]):
        lens.copy_(upload(k, np.array(new_lens, dtype=np.int32)))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_close(k, out, k.ref.mla_decode_ref(q.float(), cache.float(), tables, lens, lora, scale))
