"""The profile run that sizes the KV cache: its dummy steps, its arithmetic, its report.

On CPU the allocator's counters do not exist, so ``profile_kv_cache`` runs here with the memory
readings replaced by a fake that grows with every tensor the dummy steps allocate; the dummy steps
themselves run for real through the tiny model and its backend. The GPU test
(tests/engine/test_memory_profile_gpu.py) checks the real figures and a run at utilization 0.9.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from paddle_mla.config.schema import config_from_dict
from paddle_mla.worker import memory_profile as mp
from paddle_mla.worker.model_runner import ModelRunner
from paddle_mla.models import ensure_tiny_model


def test_dummy_prefill_batch_fills_the_budget_in_prompts_of_max_model_len():
    b = mp.dummy_prefill_batch(100, max_num_seqs=4, max_model_len=30, block_size=8, vocab_size=50)
    assert b.num_new.tolist() == [30, 30, 30, 10] and b.num_cached.tolist() == [0] * 4
    assert b.block_tables.shape == (4, 4) and (b.block_tables == np.arange(4)).all()
    assert len(b.token_ids) == 100 and b.token_ids.max() < 50 and b.is_prefill.all() and b.sample_mask.all()
    b = mp.dummy_prefill_batch(100, max_num_seqs=2, max_model_len=30, block_size=8, vocab_size=50)
    assert b.num_new.tolist() == [30, 30]        # at most max_num_seqs rows
    b = mp.dummy_prefill_batch(64, max_num_seqs=8, max_model_len=2048, block_size=16, vocab_size=50)
    assert b.num_new.tolist() == [64] and b.block_tables.shape == (1, 4)
    d = mp.dummy_decode_batch(5, vocab_size=3)
    assert d.num_new.tolist() == [1] * 5 and d.num_cached.tolist() == [1] * 5 and not d.is_prefill.any()


class FakeMemory:
    """Stands in for the GPU allocator's counters: 'allocated' is a fixed weight figure plus the
    bytes of the dummy caches, and the peak adds ``step_peak`` for every dummy step."""

    def __init__(self, weights: int, step_peak: int, total: int, free_after: int, reserved: int):
        self.weights, self.step_peak, self.total, self.free_after, self.reserved = (
            weights, step_peak, total, free_after, reserved)
        self.extra = 0
        self.peak = 0
        self.steps = 0

    def install(self, monkeypatch):
        rt = mp._runtime
        monkeypatch.setattr(rt, "memory_allocated", lambda: self.weights + self.extra)
        monkeypatch.setattr(rt, "max_memory_allocated", lambda: self.weights + self.extra + self.peak)
        monkeypatch.setattr(rt, "reset_peak_memory", self._reset)
        monkeypatch.setattr(rt, "gpu_memory_info", lambda: (self.free_after, self.total))
        monkeypatch.setattr(rt, "memory_reserved", lambda: self.reserved)
        real_step = mp.run_dummy_step

        def counted_step(*args, **kwargs):
            self.steps += 1
            self.peak = self.step_peak * self.steps
            return real_step(*args, **kwargs)

        monkeypatch.setattr(mp, "run_dummy_step", counted_step)

    def _reset(self):
        self.peak = 0


def _runner(backend: str, max_num_batched_tokens: int) -> ModelRunner:
    cfg = config_from_dict({"device": "cpu", "dtype": "float32", "attention": {"backend": backend},
                            "cache": {"block_size": 16, "num_blocks": 8},
                            "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": max_num_batched_tokens,
                                          "enable_chunked_prefill": True}})
    return ModelRunner(cfg, str(ensure_tiny_model()))


def _figures(report: str) -> dict[str, float]:
    got = {}
    for line in report.splitlines()[1:]:
        m = re.match(r"\s+([-=]?)\s*([a-zA-Z ,()-]+?)\s+(-?\d+\.\d+)", line)
        assert m, line
        got[m.group(2).strip()] = float(m.group(3))
    budget = float(re.search(r"= (-?\d+\.\d+)", report.splitlines()[1]).group(1))
    return got | {"budget": budget}


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("backend", ["native", pytest.param("triton_mla", marks=pytest.mark.triton)])
def test_profile_arithmetic_and_report(monkeypatch, capsys, backend, graphs):
    runner = _runner(backend, max_num_batched_tokens=40)
    GiB = 1 << 30
    fake = FakeMemory(weights=3 * GiB, step_peak=GiB // 2, total=80 * GiB, free_after=70 * GiB, reserved=4 * GiB)
    fake.install(monkeypatch)
    per_block = 1 << 20
    prof = mp.profile_kv_cache(runner, per_block, max_model_len=2048, index_dim=0, use_graphs=graphs)
    assert fake.steps == (2 if graphs else 1)        # the prefill step, and the decode step with graphs
    vocab = runner.arch.vocab_size
    assert prof.weights == 3 * GiB and prof.activations == GiB // 2
    assert prof.non_torch == (80 - 70 - 4) * GiB
    assert prof.sampler == mp.SAMPLER_LOGITS_COPIES * 4 * vocab * 4
    smaller_graphs = (1 + 2 + 4) - 4
    assert prof.graph_pools == ((GiB // 2) * 2 + smaller_graphs * vocab * 4 + mp.GRAPH_MARGIN_BYTES if graphs else 0)
    assert prof.kv_cache == int(80 * GiB * 0.9) - prof.weights - prof.activations - prof.sampler - prof.graph_pools \
        - prof.non_torch
    assert prof.usable_blocks == 4 * (2048 // 16) + 1
    assert prof.num_blocks == min(prof.kv_cache // per_block, prof.usable_blocks)
    assert prof.prefill_tokens == 40 and prof.prefill_rows == 1 and prof.decode_rows == 4
    report = capsys.readouterr().err
    assert report.strip() == prof.report()
    f = _figures(report)
    parts = ["weights, workspaces", "peak activations", "sampler (estimate)", "CUDA graph pools", "non-torch memory"]
    assert abs(f["budget"] - sum(f[p] for p in parts) - f["KV cache"]) <= 0.005 * (len(parts) + 2)


def test_profile_without_room_says_what_to_lower(monkeypatch):
    runner = _runner("native", max_num_batched_tokens=16)
    GiB = 1 << 30
    FakeMemory(weights=71 * GiB, step_peak=GiB, total=80 * GiB, free_after=8 * GiB, reserved=72 * GiB).install(
        monkeypatch)
    with pytest.raises(RuntimeError, match="max_num_batched_tokens"):
        mp.profile_kv_cache(runner, 1 << 20, max_model_len=2048, index_dim=0, use_graphs=False)


def test_dummy_step_runs_through_the_model():
    runner = _runner("native", max_num_batched_tokens=40)
    from paddle_mla.cache.kv_cache import allocate_latent_caches

    arch = runner.arch
    batch = mp.dummy_prefill_batch(40, 4, 2048, 16, arch.vocab_size)
    caches = allocate_latent_caches(arch.num_layers, batch.block_tables.shape[1], 16, arch.mla.latent_dim,
                                    runner.dtype, runner.device)
    logits = mp.run_dummy_step(runner, batch, caches, 4)
    host = logits.cpu().numpy()
    assert host.shape == (4, arch.vocab_size) and np.isfinite(host).all()


def test_profile_with_head_wise_swa_uses_head_wise_tables_and_sizes_per_head_ranges(monkeypatch, tmp_path):
    """cache.num_blocks: auto with head-wise SWA: the dummy steps carry [B, Hkv, M] tables (the op's
    head-wise path), and the fitted per-head budget becomes per-head ranges (full heads larger,
    SWA heads what recycled rows use) whose one flat cache stays within what the profile fitted."""
    pytest.importorskip("transformers")
    from test_head_wise_swa_oracle import QWEN3, _hf_model

    from paddle_mla.cache.head_pool import flat_cache_blocks, head_ranges

    _hf_model("Qwen3", QWEN3, seed=3).save_pretrained(tmp_path)
    cfg = config_from_dict({"model": str(tmp_path), "device": "cpu", "dtype": "float32",
                            "attention": {"backend": "native", "head_wise_swa_ratio": 0.5, "sliding_window": 32,
                                          "sink_tokens": 4},
                            "cache": {"block_size": 16, "num_blocks": 8, "swa_recycle": True},
                            "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 64,
                                          "enable_chunked_prefill": True}})
    runner = ModelRunner(cfg, str(tmp_path))
    shapes = []
    real_step = mp.run_dummy_step
    monkeypatch.setattr(mp, "run_dummy_step", lambda runner, batch, *a: (
        shapes.append(batch.block_tables.shape), real_step(runner, batch, *a))[1])
    GiB = 1 << 30
    FakeMemory(weights=GiB, step_peak=GiB // 8, total=4 * GiB, free_after=3 * GiB, reserved=GiB).install(monkeypatch)
    per_block = 4 << 20     # about 500 blocks fit, fewer than 4 rows of 4096 tokens use (1025): no cap
    prof = mp.profile_kv_cache(runner, per_block, max_model_len=4096, index_dim=0, use_graphs=True)
    assert prof.num_blocks < prof.usable_blocks
    assert shapes == [(1, 2, 4), (4, 2, 1)]          # prefill of 64 tokens, decode of 4 rows; 2 KV heads
    spec, bs = runner.head_wise_swa, 16
    full, swa = head_ranges(spec, prof.num_blocks, bs, cfg.scheduler, prof.usable_blocks)
    assert swa == 4 * (1 + 3) + 4 + 4 and full > prof.num_blocks > swa    # sink 1 + window 3 blocks a row
    per_head_block = per_block // spec.num_kv_heads
    assert flat_cache_blocks(spec, full, swa) * per_head_block <= prof.num_blocks * per_block
