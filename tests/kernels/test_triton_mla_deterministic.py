"""``deterministic: true`` for triton_mla: the fixed-split decode plan.

Every split of the batch-invariant plan is ``fixed_tiles`` tiles of its own request, counted from
the request's first key, so a request's split count and partial rows follow its length alone; the
decode output of a row is bitwise the same alone and at any position of batches of several sizes,
and matches the plain-tensor reference. Interpreter on CPU (float32), or a GPU.
"""

import numpy as np
import pytest
from helpers.triton_kernel_helpers import device_and_tolerance, kernel_namespace, random_block_tables, upload

pytestmark = pytest.mark.triton

DEV, TOL = device_and_tolerance()


@pytest.fixture(scope="module")
def k():
    return kernel_namespace(DEV)


def _plan(k, seq_lens, fixed_tiles, block_n=16, programs=5, max_bs=8):
    from paddle_mla.attention.triton_mla.decode_plan import fixed_split_workspace

    ws = fixed_split_workspace(max_bs, 2, 16, max_len=2000, split_tokens=fixed_tiles * block_n, block_n=block_n,
                               device=DEV)
    bs = len(seq_lens)
    k.dec.build_decode_plan(upload(k, np.array(seq_lens, dtype=np.int32)), bs, ws, block_n, programs,
                            fixed_tiles=fixed_tiles)
    return ws, bs


@pytest.mark.parametrize("seq_lens", [[1000, 1, 0, 40], [5, 300, 0], [64] * 6, [0]])
def test_fixed_plan_splits_follow_the_length_alone(k, seq_lens):
    fixed = 3
    ws, bs = _plan(k, seq_lens, fixed)
    tiles = [-(-n // 16) for n in seq_lens]
    want = [max(-(-t // fixed), 1) for t in tiles]
    assert ws.num_kv_splits[:bs].cpu().numpy().tolist() == want
    # each request's span starts on a window boundary: its windows are its own
    cu = ws.cu_tiles[:bs + 1].cpu().numpy()
    assert all(c % fixed == 0 for c in cu)
    assert int(ws.tiles_per_prog[0]) == fixed
    for b, n in enumerate(seq_lens):   # the same plan row alone
        alone, _ = _plan(k, [n], fixed)
        assert int(alone.num_kv_splits[0]) == want[b]


def test_fixed_plan_ignores_the_program_count(k):
    a, _ = _plan(k, [1000, 37, 5], 2, programs=1)
    b, _ = _plan(k, [1000, 37, 5], 2, programs=64)
    assert k.torch.equal(a.num_kv_splits[:3], b.num_kv_splits[:3]) and k.torch.equal(a.cu_tiles[:4], b.cu_tiles[:4])


def _decode(k, q, cache, tables, lens, fixed_tiles, heads, lora, programs):
    from paddle_mla.attention.triton_mla.decode_plan import fixed_split_workspace

    bs = q.shape[0]
    cfg = k.dec.decode_config(heads, programs=programs)
    ws = fixed_split_workspace(bs, heads, lora, max_len=4096, split_tokens=fixed_tiles * cfg.block_n,
                               block_n=cfg.block_n, device=DEV)
    k.dec.build_decode_plan(lens, bs, ws, cfg.block_n, cfg.target_items, cfg.min_tiles, fixed_tiles=fixed_tiles)
    out = k.torch.full((bs, heads, lora), float("nan"), device=DEV)
    k.dec.mla_decode(q, cache, tables, lens, out, ws, lora, q.shape[-1] ** -0.5, cfg)
    return out


@pytest.mark.parametrize("programs", [2, 7])
def test_fixed_plan_decode_row_is_bitwise_the_same_in_any_batch(k, programs):
    """Row 0 (several splits) and row 1 (one split) alone, then at every position of batches of
    3, 5 and 8 rows, on a grid with fewer programs than windows (programs loop over windows)."""
    torch = k.torch
    rng = np.random.default_rng(3)
    heads, lora, rope, page, fixed = 4, 32, 16, 16, 2
    others = [70, 0, 33, 5, 128, 1, 90]
    probe = [(100, 0), (9, 1)]
    lens_all = [n for n, _ in probe] + others
    bt, nb = random_block_tables(rng, lens_all, page)
    lk = lora + rope
    cache = upload(k, rng.standard_normal((nb, page, 1, lk)).astype(np.float32))
    q_all = upload(k, rng.standard_normal((len(lens_all), heads, lk)).astype(np.float32))
    expect = k.ref.mla_decode_ref(q_all, cache, upload(k, bt), upload(k, np.array(lens_all, dtype=np.int32)), lora,
                                  lk ** -0.5)
    for n, i in probe:
        alone = _decode(k, q_all[i:i + 1], cache, upload(k, bt[i:i + 1]), upload(k, np.array([n], dtype=np.int32)),
                        fixed, heads, lora, programs)
        torch.testing.assert_close(alone[0], expect[i], atol=TOL, rtol=TOL)
        for size in (3, 5, 8):
            for pos in range(size):
                rows = list(range(2, 2 + size - 1))
                rows = rows[:pos] + [i] + rows[pos:]
                idx = np.array(rows)
                out = _decode(k, q_all[upload(k, idx)], cache, upload(k, bt[idx]),
                              upload(k, np.array([lens_all[j] for j in rows], dtype=np.int32)), fixed, heads, lora,
                              programs)
                assert torch.equal(out[pos], alone[0]), (n, size, pos)


@pytest.mark.parametrize("max_len,split", [(512, 2048), (32768, 2048), (32769, 4096), (131072, 8192),
                                           (163840, 16384)])
def test_split_size_follows_max_model_len_alone(max_len, split):
    """The split size is at least 2048 keys and doubles until a row of max_model_len takes at most 16
    splits; so the decode workspace (every row's splits at once) is bounded by max_num_seqs x 16
    partial rows: at V3 dims (128 heads, latent 512), 256 rows and 128k, about 1.1 GB, not 4.3."""
    from paddle_mla.attention.backend import DETERMINISTIC_MAX_SPLITS, deterministic_split_tokens
    from paddle_mla.attention.triton_mla.decode_plan import fixed_splits, partial_row_bytes

    assert deterministic_split_tokens(max_len) == split
    assert -(-max_len // split) <= DETERMINISTIC_MAX_SPLITS
    assert max_len <= 32768 or -(-max_len // (split // 2)) > DETERMINISTIC_MAX_SPLITS   # the smallest that fits
    if max_len == 131072:
        ws_bytes = 256 * fixed_splits(max_len, split, 64) * partial_row_bytes(128, 512)
        assert ws_bytes <= 1.1 * 2 ** 30, ws_bytes
