"""The ``append_attn`` backend (the compiled append_attention op) against ``native`` (the plain-tensor
reference) on tiny random GQA checkpoints in fp32: identical greedy tokens and first logits within
1e-5 through batched prefill, chunked prefill mixed with decodes, a cached prefix and preemption
(tests/helpers/model_harness.py), and through the whole engine with prefix caching, chunked prefill and a
pool that preempts. CPU here (the C++ op); the GPU variants run the CUDA op with an fp32 cache, with
prefix caching / chunked prefill on and off and CUDA graphs on and off.
The checkpoints come from HF transformers classes (as in tests/models/test_gqa_oracle.py).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from helpers.model_harness import run_greedy  # noqa: E402
from test_gqa_oracle import CONFIGS, ENGINE_PROMPTS, PROMPTS, _hf_model  # noqa: E402

from paddle_mla.platform import runtime  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.models import load_model  # noqa: E402
from paddle_mla.ops import append_attention as op  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402

NEW = 8
NAMES = ["ernie4_5_g3_tied", "qwen3_g2_yarn_sharded", "llama_g1_llama3_bias"]   # interleaved / neox, groups 3, 2, 1


@pytest.fixture(scope="module", params=NAMES)
def checkpoint(request, tmp_path_factory):
    if op.implementation() != "custom_op":
        pytest.skip("custom ops not built")
    prefix, extra, save_kw = CONFIGS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    _hf_model(prefix, extra).save_pretrained(path, **save_kw)
    return path


def same(a, b, what):
    assert a.tokens == b.tokens, what
    for r, (x, y) in enumerate(zip(a.first_logits, b.first_logits)):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=0, err_msg=f"{what}, prompt {r}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_append_attn_matches_native(checkpoint, device):
    dev = runtime.device_string(device) if device == "gpu" else "cpu"
    model = load_model(str(checkpoint), torch.float32, dev, progress=False)
    for what, kw in [("batched prefill", dict(seed=1)), ("chunked prefill", dict(chunk=3, seed=2)),
                     ("cached prefix", dict(prefix_tokens=4, seed=3)), ("preemption", dict(chunk=5, preempt_at=5,
                                                                                            seed=4))]:
        want = run_greedy(model, PROMPTS, NEW, block_size=4, device=dev, backend="native", **kw)
        got = run_greedy(model, PROMPTS, NEW, block_size=4, device=dev, backend="append_attn", **kw)
        same(got, want, what)


def engine_tokens(path, backend, device, prefix, chunked, cuda_graph=False):
    llm = LLM(config_from_dict({
        "model": str(path), "device": device, "dtype": "float32", "attention": {"backend": backend},
        "cuda_graph": cuda_graph,
        "cache": {"block_size": 4, "num_blocks": 14, "enable_prefix_caching": prefix},
        "scheduler": {"max_num_seqs": 3, "max_num_batched_tokens": 8 if chunked else 64,
                      "enable_chunked_prefill": chunked}}))
    assert llm.runner.backend.name == backend
    reqs = [GenerationRequest(id=i, prompt_token_ids=p, params=SamplingParams(max_tokens=NEW, ignore_eos=True))
            for i, p in enumerate(ENGINE_PROMPTS)]
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    return [list(o.token_ids) for o in outs]


@pytest.mark.parametrize("prefix,chunked", [(True, True)])
def test_engine_append_attn_matches_native_cpu(checkpoint, prefix, chunked):
    assert engine_tokens(checkpoint, "append_attn", "cpu", prefix, chunked) == \
        engine_tokens(checkpoint, "native", "cpu", prefix, chunked)


@pytest.mark.gpu
@pytest.mark.parametrize("prefix,chunked,graph", [(True, True, True), (True, True, False), (False, False, True)])
def test_engine_append_attn_matches_native_gpu(checkpoint, prefix, chunked, graph):
    """The CUDA op with an fp32 cache, CUDA graphs on and off."""
    assert engine_tokens(checkpoint, "append_attn", "gpu", prefix, chunked, cuda_graph=graph) == \
        engine_tokens(checkpoint, "native", "gpu", prefix, chunked)
