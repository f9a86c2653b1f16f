"""``deterministic: true`` for triton_mla's prompt tokens: the segmented expanded extend
(``extend_segments.py``).

A prompt token's output must be bitwise the same whether its prompt runs whole or in chunks of any
size, alone or among other rows in any order, in launches packed for any workspace size, and match
the plain-tensor attention over the expanded keys. Interpreter on CPU (float32), or a GPU.
"""

import numpy as np
import pytest
from helpers.triton_kernel_helpers import device_and_tolerance, kernel_namespace, random_block_tables, upload

pytestmark = pytest.mark.triton

DEV, TOL = device_and_tolerance()
H, C, NOPE, ROPE, DV, PAGE = 2, 32, 16, 16, 16, 16
SEGMENT = 64


@pytest.fixture(scope="module")
def k():
    return kernel_namespace(DEV)


class _Requests:
    """Random prompts with their latent rows (already in a paged cache: the step writes its latent
    before attention), queries and the kv_b_proj weights."""

    def __init__(self, k, lens, seed=0, dtype=None):
        rng = np.random.default_rng(seed)
        self.k, self.lens = k, lens
        self.dtype = dtype or k.torch.float32
        self.tables, nb = random_block_tables(rng, lens, PAGE)
        f = np.float32
        self.latent = [rng.standard_normal((n, C + ROPE)).astype(f) for n in lens]
        self.q_nope = [rng.standard_normal((n, H, NOPE)).astype(f) for n in lens]
        self.q_pe = [rng.standard_normal((n, H, ROPE)).astype(f) for n in lens]
        self.w_kc = upload(k, (rng.standard_normal((H, NOPE, C)) / C ** 0.5).astype(f)).to(self.dtype)
        self.w_vc = upload(k, (rng.standard_normal((H, C, DV)) / C ** 0.5).astype(f)).to(self.dtype)
        cache = np.zeros((nb, PAGE, 1, C + ROPE), dtype=f)
        for r, n in enumerate(lens):
            for i in range(n):
                cache[self.tables[r, i // PAGE], i % PAGE, 0] = self.latent[r][i]
        self.cache = upload(k, cache).to(self.dtype)

    def step(self, rows, capacity=128):
        """rows: (request, cached, new tokens) each; returns the outputs of each row's tokens."""
        from types import SimpleNamespace

        from paddle_mla.attention.backend import MLADims
        from paddle_mla.attention.triton_mla.extend import ExtendWorkspace
        from paddle_mla.attention.triton_mla.extend_segments import SegmentedExtend

        k = self.k
        dims = MLADims(H, C, NOPE, ROPE, DV, (NOPE + ROPE) ** -0.5)
        q_lens = np.array([n for _, _, n in rows], dtype=np.int32)
        k_lens = np.array([c + n for _, c, n in rows], dtype=np.int32)
        cat = lambda arrs: upload(k, np.concatenate([a[c:c + n] for (r, c, n), a in zip(rows, arrs)])).to(self.dtype)
        q_nope = cat([self.q_nope[r] for r, _, _ in rows])
        q_pe = cat([self.q_pe[r] for r, _, _ in rows])
        latent = cat([self.latent[r] for r, _, _ in rows])
        meta = SimpleNamespace(block_tables=upload(k, self.tables[[r for r, _, _ in rows]]), seq_lens_q=q_lens,
                               seq_lens_k=k_lens)
        T = int(q_lens.sum())
        ws = ExtendWorkspace(dims, T, capacity, DEV, self.dtype)
        ws.out.fill_(float("nan"))
        seg = SegmentedExtend(ws, DEV, SEGMENT)
        plan = seg.plan(meta, np.arange(len(rows)))
        seg.run(plan, q_nope, q_pe, latent, self.w_kc, self.w_vc, self.cache, meta)
        out, ends = ws.out[:T].clone(), np.cumsum(q_lens)
        return [out[e - n:e] for e, n in zip(ends, q_lens)], plan

    def reference(self, r):
        """Causal attention of request r's prompt over its expanded keys, float64."""
        torch = self.k.torch
        lat = torch.from_numpy(self.latent[r]).double()
        w_kc, w_vc = self.w_kc.cpu().double(), self.w_vc.cpu().double()
        k_nope = torch.einsum("tc,hdc->thd", lat[:, :C], w_kc)
        v = torch.einsum("tc,hcd->thd", lat[:, :C], w_vc)
        q = torch.cat([torch.from_numpy(self.q_nope[r]), torch.from_numpy(self.q_pe[r])], -1).double()
        keys = torch.cat([k_nope, lat[:, None, C:].expand(-1, H, -1)], -1)
        s = torch.einsum("qhd,khd->hqk", q, keys) * (NOPE + ROPE) ** -0.5
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


def test_plan_pieces_follow_positions():
    from paddle_mla.attention.triton_mla.extend_segments import plan_segments

    # row 0: 150 keys (3 segments of 64), 20 new; row 1: decode-like, skipped; row 2: 64 keys exactly
    plan = plan_segments(np.array([20, 0, 64]), np.array([150, 9, 64]), np.arange(3), 64, 100)
    recs = plan.records
    assert plan.rounds == 3 and plan.max_seqlen_q == 64
    assert recs[:, 3].tolist() == [0, 0, 64, 128] and recs[:, 4].tolist() == [64, 64, 128, 150]
    assert recs[:, 6].tolist() == [0, 2, 0, 0]            # block-table rows
    # round 0 (128 rows) does not fit 100: two launches; rounds 1 and 2 merge
    assert [(l.count, l.rows, l.merge) for l in plan.launches] == [(1, 64, False), (1, 64, False), (1, 64, True),
                                                                 (1, 22, True)]
    assert [r[5] for r in recs] == [0, 0, 0, 0]             # each launch's first piece at row 0


def test_segmented_extend_matches_the_reference(k):
    reqs = _Requests(k, [300, 70, 5])
    outs, plan = reqs.step([(0, 0, 300), (1, 0, 70), (2, 0, 5)])
    assert plan.rounds == 5 and len(plan.launches) > plan.rounds     # several launches in round 0
    for r, out in enumerate(outs):
        assert not k.torch.isnan(out).any()
        k.torch.testing.assert_close(out.cpu().double(), reqs.reference(r), atol=TOL, rtol=TOL)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"] if DEV != "cpu" else ["float32"])
@pytest.mark.parametrize("capacity", [64, 128, 512])
def test_prompt_token_bits_follow_the_prompt_alone(k, capacity, dtype):
    """Request 0 whole, then in chunks of 37 / 43 / 150 + 70 tokens (chunk edges inside segments
    and query blocks), alone and between other rows: every token's output bitwise equal."""
    torch = k.torch
    reqs = _Requests(k, [220, 90, 130], seed=1, dtype=getattr(torch, dtype))
    whole = reqs.step([(0, 0, 220)], capacity)[0][0]
    for cuts in ([37, 80, 220], [43, 150, 220], [150, 220]):
        start = 0
        for i, end in enumerate(cuts):
            alone = reqs.step([(0, start, end - start)], capacity)[0][0]
            mixed = [(1, 20, 70), (0, start, end - start), (2, 0, 130)] if i % 2 else \
                [(0, start, end - start), (2, 64, 66), (1, 0, 90)]
            outs = reqs.step(mixed, capacity)[0]
            got = outs[1] if i % 2 else outs[0]
            assert torch.equal(alone, whole[start:end]), (cuts, i)
            assert torch.equal(got, whole[start:end]), (cuts, i)
            start = end


def test_mode_step_runs_prompt_rows_segmented_and_output_rows_absorbed(k):
    """A whole ``triton_mla`` step under the mode: decode rows, a preempted request's recomputed
    outputs and two prompt rows (one continuing a chunk over a cached prefix) equal ``native``."""
    from helpers.mixed_batch_cases import make_case, run_backend

    torch = k.torch
    rows, prompt_lens = [(37, 1), (16, 1), (90, 20), (0, 13), (64, 17)], [30, 10, 90, 13, 81]
    case = make_case(rows, page=8, device=DEV, dtype=torch.float32, seed=3, prompt_lens=prompt_lens)
    seg = 32 if DEV == "cpu" else 64     # a multiple of the extend kernel's key tile (16 / 64)
    got, _, meta = run_backend("triton_mla", case, DEV, deterministic=True, segment_tokens=seg)
    native, _, _ = run_backend("native", case, DEV)
    torch.testing.assert_close(got, native, atol=TOL, rtol=TOL)
    split = meta.attn.short_split
    assert (split.lead_begin, split.lead_end, split.rows) == (2, 3, 20)
    # the prompt rows' pieces: 13 keys in one segment; 81 keys from 0 in segments of seg
    bounds = list(range(0, 81, seg)) + [81]
    assert [tuple(r[3:5]) for r in meta.attn.segments.records] == [(0, 13)] + list(zip(bounds, bounds[1:]))
