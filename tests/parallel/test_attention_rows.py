"""Attention split by rows under tensor parallelism (``parallel.attention_split: rows``): the host
split of a step's tokens (every token attended once, a cut request's earlier tokens counted as
cached), the replicated attention weights, the clear refusals, and engines over gloo on CPU that
give TP=1's greedy tokens with prefix caching, chunked prefill and preemption, at a rank count that
does not divide the heads, and with the Triton backend under the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from paddle_mla.platform import runtime
from paddle_mla.parallel.launcher import TORCH_ONLY

pytestmark = pytest.mark.skipif(runtime.is_paddle(), reason=TORCH_ONLY)


def _batch(num_new, num_cached):
    from paddle_mla.attention.forward_meta import StepBatch

    num_new, num_cached = np.asarray(num_new, np.int32), np.asarray(num_cached, np.int32)
    B = len(num_new)
    return StepBatch(token_ids=np.arange(int(num_new.sum()), dtype=np.int64), num_new=num_new, num_cached=num_cached,
                     block_tables=np.arange(B * 3, dtype=np.int32).reshape(B, 3), is_prefill=num_new > 1,
                     sample_mask=np.ones(B, dtype=bool))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 20)), min_size=1, max_size=7), st.integers(1, 5))
def test_shares_cover_every_token_once_at_its_position(rows, size):
    from paddle_mla.attention.row_share import share_batch, share_range

    batch = _batch([n for n, _ in rows], [c for _, c in rows])
    # every token's (block-table row, position) in the whole step
    whole = [(tuple(batch.block_tables[i]), int(batch.num_cached[i]) + j)
             for i, n in enumerate(batch.num_new) for j in range(n)]
    seen, chunks = [], set()
    for rank in range(size):
        start, stop, chunk = share_range(len(whole), rank, size)
        chunks.add(chunk)
        part = share_batch(batch, start, stop)
        assert list(part.token_ids) == list(range(start, stop))
        assert (part.num_new > 0).all() and not part.sample_mask.any()
        seen += [(tuple(part.block_tables[i]), int(part.num_cached[i]) + j)
                 for i, n in enumerate(part.num_new) for j in range(n)]
    assert seen == whole
    assert len(chunks) == 1 and chunks.pop() * size >= len(whole)


def test_attention_weights_are_whole_on_every_rank_and_bad_models_are_refused():
    from paddle_mla.models import load_arch
    from paddle_mla.models.sharding import checkpoint_shard, local_arch
    from paddle_mla.models.tiny import ensure_tiny_model

    arch = load_arch(str(ensure_tiny_model()))
    attn = "model.layers.0.self_attn."
    for name in ("q_proj.weight", "kv_b_proj.weight", "o_proj.weight"):
        assert checkpoint_shard(attn + name, [64, 64], arch, 1, 3, attention_rows=True) is None
        assert checkpoint_shard(attn + name, [64, 64], arch, 1, 2) is not None
    # the MLPs and the vocabulary stay split
    assert checkpoint_shard("model.layers.0.mlp.gate_proj.weight", [90, 64], arch, 1, 3, attention_rows=True)
    assert checkpoint_shard("lm_head.weight", [300, 64], arch, 1, 3, attention_rows=True)
    assert local_arch(arch, 3, attention_rows=True).mla.num_heads == arch.mla.num_heads
    import dataclasses

    gqa = dataclasses.replace(arch, family="gqa")
    with pytest.raises(ValueError, match="needs an MLA model"):
        local_arch(gqa, 2, attention_rows=True)
    v32 = dataclasses.replace(arch, indexer=object())
    with pytest.raises(ValueError, match="sparse attention"):
        local_arch(v32, 2, attention_rows=True)


def test_run_line_names_the_split():
    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.run_info import describe_run

    def line(**par):
        cfg = config_from_dict({"runtime": "torch", "device": "cpu", "parallel": par})
        return describe_run(cfg)[0].line()

    assert line(tensor_parallel_size=2, attention_split="rows", expert_parallel=True).endswith(
        ", tensor parallel 2, attention by rows, experts whole")
    assert line(tensor_parallel_size=2).endswith(", tensor parallel 2, attention by heads")
    assert "parallel" not in line(attention_split="rows")


def test_bad_split_name_is_a_config_error():
    from paddle_mla.config.schema import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="attention_split"):
        config_from_dict({"parallel": {"tensor_parallel_size": 2, "attention_split": "tokens"}})


def _generate(tp: int, reqs, **over):
    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.llm import LLM

    cfg = {"runtime": "torch", "device": "cpu", "dtype": "float32",
           "cache": {"block_size": 4, "num_blocks": 256, "enable_prefix_caching": True},
           "scheduler": {"enable_chunked_prefill": True, "max_num_batched_tokens": 13, "max_num_seqs": 5},
           "parallel": {"tensor_parallel_size": tp, "attention_split": "rows"}}
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    llm = LLM(config_from_dict(cfg))
    try:
        outs = llm.generate(reqs, use_tqdm=False)
        return [o.token_ids for o in outs], llm.stats()
    finally:
        llm.close()


def _requests(n: int = 7):
    import random

    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    rng = random.Random(3)
    shared = [rng.randrange(3, 200) for _ in range(11)]
    return [GenerationRequest(i, shared[:rng.choice([0, 4, 11])] + [rng.randrange(3, 200) for _ in range(2 + 3 * i)],
                              SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True)) for i in range(n)]


def test_three_ranks_with_preemption_match_one():
    """3 ranks (the tiny model's heads do not split 3 ways: rows keep them whole), a pool small
    enough to preempt, prefix hits and 13-token steps that cut prompt chunks between ranks."""
    reqs = _requests()
    small = {"num_blocks": 14}
    one, _ = _generate(1, reqs, cache=small)
    three, stats = _generate(3, reqs, cache=small)
    assert stats.num_preemptions > 0 and stats.cached_prompt_tokens > 0
    assert three == one


def test_rows_with_expert_parallel_match_one():
    """Rows beside experts placed whole: the MoE runs every gathered token on each rank's experts."""
    reqs = _requests(5)
    one, _ = _generate(1, reqs)
    two, _ = _generate(2, reqs, parallel={"tensor_parallel_size": 2, "attention_split": "rows",
                                          "expert_parallel": True})
    assert two == one


def test_sparse_attention_model_is_refused_before_loading():
    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.llm import LLM
    from paddle_mla.models.tiny import ensure_tiny_model

    cfg = config_from_dict({"model": str(ensure_tiny_model("deepseek_v32")), "runtime": "torch", "device": "cpu",
                            "parallel": {"tensor_parallel_size": 2, "attention_split": "rows"}})
    with pytest.raises(ValueError, match="sparse attention"):
        LLM(cfg)


@pytest.mark.triton
def test_triton_mla_rows_match_native_tp1():
    """The Triton backend's own cache write and its decode / extend paths on each rank's share."""
    reqs = _requests(4)
    one, _ = _generate(1, reqs, attention={"backend": "native"})
    two, _ = _generate(2, reqs, attention={"backend": "triton_mla"})
    assert two == one


def test_bench_compares_the_two_splits_in_one_process():
    """`paddle-mla bench` over two tensor-parallel configs (configs/bench/tp2_*.yaml): one group per
    process, so auto rebuilds (and closes) each engine; keeping both is refused up front."""
    from helpers.cli_harness import ROOT, invoke

    configs = ["--config", str(ROOT / "configs/bench/tp2_heads.yaml"), "--config",
               str(ROOT / "configs/bench/tp2_rows.yaml"), "--set", "device=cpu",
               "--workload", "random:num_prompts=4,input_len=16,output_len=4", "--repeats", "1", "--warmup", "1"]
    res = invoke(["bench", *configs])
    assert res.exit_code == 0, res.stderr
    assert "engines rebuild" in res.stderr
    table = [line for line in res.stdout.splitlines() if line.startswith("| tp2_")]
    assert [line.split("|")[1].strip() for line in table] == ["tp2_heads", "tp2_rows"]
    keep = invoke(["bench", *configs, "--engines", "keep"])
    assert keep.exit_code == 2 and "one tensor-parallel group at a time" in keep.stderr
