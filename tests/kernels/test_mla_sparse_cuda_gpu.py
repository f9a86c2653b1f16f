"""The ``mla_sparse`` CUDA op (SM90; DSA's sparse MLA through ``sparse_mla`` with the CUDA config) on
the GPU: bf16 vs the plain reference ``sparse_mla_ref`` over head counts (16 and 100 pad their 64-head
programs), top-k sizes that are not whole tiles, scattered invalid slots, a row's invalid tail, a row
whose leading tiles hold none and a row with none valid (zeros), the plan's chunk counts and forced
ones through the merge, page sizes; bitwise determinism over 5 poisoned runs; a row's bits at one
chunk do not depend on its batch (the deterministic mode's premise); strided q views; CUDA-graph
replay with new slots. Tolerances: the Triton decode tests' (check_close)."""

import pytest
from helpers.triton_kernel_helpers import check_close, cuda_mla_namespace, poisoned_runs

pytestmark = [pytest.mark.gpu, pytest.mark.triton]

C, R = 512, 64
SCALE = 192 ** -0.5


@pytest.fixture(scope="module")
def k():
    ns = cuda_mla_namespace("mla_sparse")
    from paddle_mla.attention.dsa import sparse_mla as sm

    ns.sm = sm
    return ns


def _case(k, rows, heads, topk, page, seed, blocks=200):
    torch = k.torch
    g = torch.Generator(device=k.dev).manual_seed(seed)
    cache = torch.randn(blocks, page, 1, C + R, device=k.dev, generator=g).to(torch.bfloat16)
    slots = torch.randint(0, blocks * page, (rows, topk), device=k.dev, generator=g)
    slots[torch.rand(rows, topk, device=k.dev, generator=g) < 0.1] = -1
    if rows > 1:
        slots[1, topk // 3:] = -1
    if rows > 2:
        slots[2] = -1
    if rows > 3:
        slots[3, :128] = -1      # leading tiles with no valid slot, then valid ones
    q = torch.randn(rows, heads, C + R, device=k.dev, generator=g).to(torch.bfloat16)
    return cache, slots, q[..., :C].contiguous(), q[..., C:].contiguous()


def _run(k, q_lat, q_pe, cache, slots, forced=0, **cfg):
    torch, sm = k.torch, k.sm
    rows, heads, _ = q_lat.shape
    config = sm.sparse_config(heads, cuda=True, **cfg)
    splits = forced or sm.plan_splits(rows, heads, slots.shape[1], config)[0]
    part_o = torch.empty(rows * heads * splits * C, dtype=torch.float32, device=k.dev)
    part_lse = torch.empty(rows * heads * splits, dtype=torch.float32, device=k.dev)
    out = torch.full((rows, heads, C), float("nan"), device=k.dev).to(torch.bfloat16)
    return sm.sparse_mla(q_lat, q_pe, cache, slots, SCALE, part_o, part_lse, out, config, num_splits=forced)


# (rows, heads, top-k, page): V3.2's 128 heads and top-2048 at decode and prefill sizes, its TP=2/8
# head counts (64, 16), a padded head group (100); top-k of one key, of a part tile, of one tile
@pytest.mark.parametrize("rows,heads,topk,page", [
    (1, 128, 2048, 64), (3, 128, 2048, 64), (64, 128, 2048, 64), (300, 128, 2048, 16), (5, 64, 2048, 64),
    (7, 16, 2048, 64), (4, 100, 700, 64), (9, 128, 1, 64), (9, 128, 100, 64), (9, 128, 64, 16),
    (33, 16, 333, 1),
], ids=lambda x: str(x))
def test_sparse_cuda_bf16(k, rows, heads, topk, page):
    cache, slots, q_lat, q_pe = _case(k, rows, heads, topk, page, rows + heads + topk + page)
    got = _run(k, q_lat, q_pe, cache, slots)
    check_close(k, got, k.sm.sparse_mla_ref(q_lat, q_pe, cache, slots, SCALE))
    if rows > 2:
        assert float(got[2].float().abs().max()) == 0.0, "a row with no valid slot must give zeros"


@pytest.mark.parametrize("forced", [1, 2, 5, 32])
def test_sparse_cuda_forced_chunks(k, forced):
    cache, slots, q_lat, q_pe = _case(k, 6, 128, 2048, 64, forced)
    got = _run(k, q_lat, q_pe, cache, slots, forced=forced)
    check_close(k, got, k.sm.sparse_mla_ref(q_lat, q_pe, cache, slots, SCALE))


def test_sparse_cuda_deterministic_and_batch_invariant(k):
    """Five poisoned runs are bitwise equal; at one chunk each row's bits are those it gets alone."""
    torch = k.torch
    cache, slots, q_lat, q_pe = _case(k, 37, 128, 2048, 64, 7)
    rows, heads = q_lat.shape[:2]
    part_o = torch.empty(rows * heads * 32 * C, dtype=torch.float32, device=k.dev)
    part_lse = torch.empty(rows * heads * 32, dtype=torch.float32, device=k.dev)
    out = torch.empty(rows, heads, C, dtype=torch.bfloat16, device=k.dev)
    cfg = k.sm.sparse_config(heads, cuda=True)
    poisoned_runs(k, lambda: k.sm.sparse_mla(q_lat, q_pe, cache, slots, SCALE, part_o, part_lse, out, cfg), out)
    batch = _run(k, q_lat, q_pe, cache, slots, forced=1)
    for r in (0, 1, 20, 36):
        alone = _run(k, q_lat[r:r + 1], q_pe[r:r + 1], cache, slots[r:r + 1], forced=1)
        assert torch.equal(alone[0], batch[r]), f"row {r}'s bits follow its batch"


def test_sparse_cuda_strided_queries(k):
    """q_lat and q_pe as views of one [T, H, 576] query (their rows 1152 bytes apart) give the bits
    of packed copies."""
    torch = k.torch
    cache, slots, _, _ = _case(k, 11, 128, 1000, 64, 3)
    q = torch.randn(11, 128, C + R, device=k.dev).to(torch.bfloat16)
    got = _run(k, q[..., :C], q[..., C:], cache, slots)
    assert torch.equal(got, _run(k, q[..., :C].contiguous(), q[..., C:].contiguous(), cache, slots))


def test_sparse_cuda_graph_replay(k):
    """A captured call replays with new queries and slots written into its inputs."""
    torch = k.torch
    cache, slots, q_lat, q_pe = _case(k, 4, 128, 2048, 64, 11)
    out = torch.empty(4, 128, C, dtype=torch.bfloat16, device=k.dev)
    part_o = torch.empty(4 * 128 * 32 * C, dtype=torch.float32, device=k.dev)
    part_lse = torch.empty(4 * 128 * 32, dtype=torch.float32, device=k.dev)
    cfg = k.sm.sparse_config(128, cuda=True)
    call = lambda: k.sm.sparse_mla(q_lat, q_pe, cache, slots, SCALE, part_o, part_lse, out, cfg)  # noqa: E731
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    _, slots2, q_lat2, q_pe2 = _case(k, 4, 128, 2048, 64, 12)
    slots.copy_(slots2)
    q_lat.copy_(q_lat2)
    q_pe.copy_(q_pe2)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check_close(k, out, k.sm.sparse_mla_ref(q_lat2, q_pe2, cache, slots2, SCALE))
