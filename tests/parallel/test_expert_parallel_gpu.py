"""Expert parallelism on 2 and 4 GPUs (NCCL): TP=2 and TP=4 + EP give TP=1's greedy tokens in fp32 on a tiny
DeepSeek MoE checkpoint, through the fused MoE (each rank's experts, other ranks' ids skipped) and
through the masked reference MoE (``PADDLE_MLA_MOE=reference``, inherited by the spawned worker)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")   # exact fp32 dots, in the workers too (inherited)

import pytest  # noqa: E402
from helpers.gpus import sizes  # noqa: E402

from paddle_mla.platform import runtime  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(runtime.is_paddle() or runtime.gpu_count() < 2,
                                 reason="needs 2 GPUs and the torch runtime")]


def _tokens(model_dir, tp: int, expert_parallel: bool):
    from test_tensor_parallel import PROMPTS

    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.llm import LLM
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    llm = LLM(config_from_dict({
        "model": str(model_dir), "device": "gpu", "dtype": "float32", "cuda_graph": False,
        "cache": {"block_size": 16, "num_blocks": 64, "enable_prefix_caching": True},
        "scheduler": {"max_num_seqs": 3, "max_num_batched_tokens": 8, "enable_chunked_prefill": True},
        "parallel": {"tensor_parallel_size": tp, "expert_parallel": expert_parallel}}))
    try:
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        outs = llm.generate([GenerationRequest(i, p, params) for i, p in enumerate(PROMPTS)], use_tqdm=False)
        assert [o.error for o in outs] == [None] * len(PROMPTS)
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.close()


@pytest.mark.parametrize("tp", sizes("tp", 2, 4))
@pytest.mark.parametrize("moe", ["triton", "reference"])
def test_tp_ep_fp32_matches_tp1(tmp_path, monkeypatch, moe, tp):
    pytest.importorskip("transformers")
    from test_model_oracle import CONFIGS, _hf_model

    monkeypatch.setenv("PADDLE_MLA_MOE", moe)
    model_type, extra = CONFIGS["v3_qlora_yarn_noaux"]
    _hf_model(model_type, {**extra, "num_attention_heads": 4, "num_key_value_heads": 4}).save_pretrained(tmp_path)
    assert _tokens(tmp_path, tp, True) == _tokens(tmp_path, 1, False)
