"""The ``dsa`` backend (Triton kernels) against ``native`` on the tiny deepseek_v32 model (no
transformers needed): identical greedy tokens and close logits through batched prefill, chunked
prefill mixed with decodes, a cached prefix and preemption; prompts longer than index_topk (16), so
attention is sparse. ``chunked_dense_first`` gives the backend the model's top-k, as the engine does:
its first step (every context 13 <= 16) runs dense through triton_mla's kernels, the later ones sparse.
Float32: the interpreter on CPU, or a GPU (run with TRITON_F32_DEFAULT=ieee)."""

import numpy as np
import pytest
from helpers.model_harness import run_greedy

from paddle_mla.platform import runtime
from paddle_mla.config.backends import check_model_backend
from paddle_mla.models import load_model, make_tiny_model
from paddle_mla.platform.tensor_api import torch

pytestmark = pytest.mark.triton

DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")
NEW = 8
_rng = np.random.default_rng(11)
PROMPTS = [[int(t) for t in _rng.integers(2, 500, n)] for n in (45, 30, 21)]
RUNS = {
    "batched": dict(block_size=16, seed=1),
    "chunked": dict(block_size=16, chunk=13, seed=2),
    "prefix": dict(block_size=64, prefix_tokens=20, seed=3),
    "preempt": dict(block_size=16, chunk=32, preempt_at=4, seed=4),
    "chunked_dense_first": dict(block_size=16, chunk=13, seed=2, dsa_kwargs={"index_topk": 16}),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("tiny_v32"), arch="deepseek_v32", seed=0)
    m = load_model(str(path), torch.float32, DEV)
    assert m.arch.indexer is not None and m.arch.indexer.topk < min(len(p) for p in PROMPTS)
    return m


@pytest.mark.parametrize("run", sorted(RUNS))
def test_dsa_matches_native(model, run):
    kw = dict(RUNS[run])
    dsa_kwargs = kw.pop("dsa_kwargs", None)
    assert dsa_kwargs is None or dsa_kwargs["index_topk"] == model.arch.indexer.topk
    native = run_greedy(model, PROMPTS, NEW, device=DEV, backend="native", **kw)
    dsa = run_greedy(model, PROMPTS, NEW, device=DEV, backend="dsa", backend_kwargs=dsa_kwargs, **kw)
    for r in range(len(PROMPTS)):
        assert dsa.tokens[r] == native.tokens[r], f"prompt {r}"
        np.testing.assert_allclose(dsa.first_logits[r], native.first_logits[r], atol=2e-4, rtol=0)


def test_backend_model_mismatch_is_a_config_error():
    assert "dsa" in check_model_backend("deepseek_v32", "triton_mla")
    assert "triton_mla" in check_model_backend("deepseek_v3", "dsa")
    assert check_model_backend("deepseek_v32", "dsa") is None
    assert check_model_backend("deepseek_v32", "native") is None
    assert check_model_backend("deepseek_v3", "triton_mla") is None
