"""Tensor parallelism of the GQA families over gloo on CPU (fp32): TP=2 gives the greedy tokens of
TP=1, and both give HF transformers' tokens, on the oracle configs of tests/models/test_gqa_oracle.py.

Covered: qwen3 (per-head q/k norm, attention biases, tied; a sharded checkpoint), llama (tied,
group 3; mlp/attention biases: the row-parallel output biases are added once), qwen3_moe and
ernie4_5_moe (routed experts split by width, shared experts), through the whole engine with
chunked prefill and prefix caching; head-wise SWA (the SWA heads balanced over the ranks) against
TP=1 and HF with the head-wise window. Also the config errors: KV heads that do not divide by the TP
size (not replicated), SWA and full heads that do not. Torch only: skipped under paddle with the reason.
"""

import json

import pytest

from paddle_mla.platform import runtime
from paddle_mla.parallel.launcher import TORCH_ONLY

pytestmark = pytest.mark.skipif(runtime.is_paddle(), reason=TORCH_ONLY)

# name in test_gqa_oracle.CONFIGS -> overrides that give an even KV-head count (2 KV heads per rank at most)
CASES = {
    "qwen3_g2_yarn_sharded": dict(num_attention_heads=4, num_key_value_heads=2),        # q/k norm, sharded, untied
    "qwen3_g1_bias_tied": {},                                                            # 4 KV heads, biases, tied
    "llama_g3_linear_tied": {},                                                          # group 3, tied
    "llama_g1_llama3_bias": dict(num_attention_heads=6, num_key_value_heads=2, head_dim=10),  # mlp_bias
    "qwen3_moe_g2_norm": dict(num_attention_heads=4, num_key_value_heads=2),
    "ernie4_5_moe_g3_shared_bias": {},                                                   # shared experts, tied
}


def _generate(tp: int, prompts, max_tokens: int, model: str):
    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.llm import LLM
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    llm = LLM(config_from_dict({
        "runtime": "torch", "device": "cpu", "dtype": "float32", "model": model,
        "parallel": {"tensor_parallel_size": tp},
        "cache": {"block_size": 4, "enable_prefix_caching": True},
        "scheduler": {"max_num_seqs": 3, "max_num_batched_tokens": 8, "enable_chunked_prefill": True}}))
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        outs = llm.generate([GenerationRequest(i, p, params) for i, p in enumerate(prompts)], use_tqdm=False)
        assert [o.error for o in outs] == [None] * len(prompts)
        if tp > 1:   # each rank's KV cache holds only its KV heads
            heads = llm.runner.arch.gqa.num_kv_heads
            assert llm.runner.kv_caches[0][0].shape[0] == heads
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_gqa_tp2_matches_tp1_and_hf(name, tmp_path):
    pytest.importorskip("transformers")
    from test_gqa_oracle import CONFIGS, ENGINE_PROMPTS, NEW_TOKENS, _hf_greedy, _hf_model

    prefix, extra, save_kw = CONFIGS[name]
    hf = _hf_model(prefix, {**extra, **CASES[name]})
    hf.save_pretrained(tmp_path, **save_kw)
    expected = [tokens for tokens, _ in _hf_greedy(hf, ENGINE_PROMPTS)]
    one = _generate(1, ENGINE_PROMPTS, NEW_TOKENS, str(tmp_path))
    two = _generate(2, ENGINE_PROMPTS, NEW_TOKENS, str(tmp_path))
    assert one == expected
    assert two == one


def test_kv_heads_not_divisible_is_a_clear_error(tmp_path):
    """3 KV heads over 2 ranks: refused (KV heads are split, never replicated), naming both values,
    from config.json alone (no weights in the folder, no worker started)."""
    from test_gqa_oracle import _BASE, CONFIGS

    from paddle_mla.models.arch import load_arch
    from paddle_mla.models.sharding import local_arch

    cfg = {"model_type": "qwen3", **_BASE, **CONFIGS["qwen3_g2_yarn_sharded"][1]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = load_arch(str(tmp_path))
    with pytest.raises(ValueError, match=r"tensor_parallel_size 2 must divide num_key_value_heads 3"):
        local_arch(arch, 2)
    local = local_arch(arch, 3)
    assert (local.gqa.num_heads, local.gqa.num_kv_heads) == (2, 1)


def _swa_tokens(tp: int, model: str, backend: str, prompts, new_tokens: int, window: int, sink: int,
                recycle: bool = False):
    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.llm import LLM
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    llm = LLM(config_from_dict({
        "runtime": "torch", "device": "cpu", "dtype": "float32", "model": model,
        "parallel": {"tensor_parallel_size": tp},
        "attention": {"backend": backend, "head_wise_swa_ratio": 0.5, "sliding_window": window, "sink_tokens": sink},
        "cache": {"block_size": 4, "enable_prefix_caching": True, "swa_recycle": recycle},
        "scheduler": {"max_num_seqs": 3, "max_num_batched_tokens": 8, "enable_chunked_prefill": True}}))
    try:
        spec = llm.runner.head_wise_swa    # each rank: half its KV heads SWA, the last ones
        assert (spec.num_kv_heads, spec.num_swa_heads) == (4 // tp, 2 // tp)
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        outs = llm.generate([GenerationRequest(i, p, params) for i, p in enumerate(prompts)], use_tqdm=False)
        assert [o.error for o in outs] == [None] * len(prompts)
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.close()


@pytest.mark.parametrize("backend,recycle", [("append_attn", False), ("append_attn", True), ("native", False)])
def test_head_wise_swa_tp2_matches_tp1_and_the_windowed_oracle(backend, recycle, tmp_path):
    """4 KV heads, the last 2 SWA (window 5, sink 2): at TP=2 each rank holds one full and one SWA
    head (the loader balances them), and the greedy tokens are TP=1's and those of HF with the
    head-wise window (tests/models/test_head_wise_swa_oracle.py)."""
    pytest.importorskip("transformers")
    from test_gqa_oracle import _hf_model
    from test_head_wise_swa_oracle import NEW, PROMPTS, QWEN3, SINK, _oracle

    hf = _hf_model("Qwen3", dict(QWEN3, num_attention_heads=8, num_key_value_heads=4), seed=3)
    hf.save_pretrained(tmp_path)
    expected = _oracle(hf, 2, 5)
    assert expected != _oracle(hf, 0, 5), "the window must change the tokens, or this test shows nothing"
    one = _swa_tokens(1, str(tmp_path), backend, PROMPTS, NEW, 5, SINK, recycle)
    two = _swa_tokens(2, str(tmp_path), backend, PROMPTS, NEW, 5, SINK, recycle)
    assert one == expected
    assert two == one


def test_head_wise_swa_heads_that_do_not_split_evenly_are_a_config_error(tmp_path):
    """1 SWA head of 4 (ratio 0.25) over 2 ranks: one rank would hold it alone. Refused at plan time
    (from config.json alone), naming both counts."""
    from test_head_wise_swa_oracle import QWEN3

    from paddle_mla.config.schema import ConfigError, config_from_dict
    from paddle_mla.models.arch import load_arch
    from paddle_mla.worker.plan import kv_layout

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", **QWEN3, "num_attention_heads": 8,
                                                      "num_key_value_heads": 4}))
    cfg = config_from_dict({"runtime": "torch", "model": str(tmp_path), "parallel": {"tensor_parallel_size": 2},
                            "attention": {"head_wise_swa_ratio": 0.25, "sliding_window": 8}})
    with pytest.raises(ConfigError, match=r"tensor_parallel_size' 2 must divide both the 3 full and the 1 SWA"):
        kv_layout(cfg, load_arch(str(tmp_path)))
