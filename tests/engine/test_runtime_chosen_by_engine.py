"""The runtime is chosen by the engine, never by an import (docs/architecture.md, "platform").

In a fresh process, importing every subpackage first must select nothing; then ``LLM`` with either
runtime, whichever ``PADDLE_MLA_RUNTIME`` says, must load and generate on that runtime. A tensor
module imported before any runtime is chosen refuses with a clear message instead of binding the
wrong ``torch``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paddle_mla.platform import runtime

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
from paddle_mla.platform import runtime
import paddle_mla.attention, paddle_mla.attention.triton_mla, paddle_mla.attention.dsa
import paddle_mla.cache, paddle_mla.cache.block_pool, paddle_mla.engine, paddle_mla.engine.llm
import paddle_mla.models, paddle_mla.models.fused_moe, paddle_mla.ops
from paddle_mla.models import ensure_tiny_model, load_arch       # tensor-free names load lazily
assert runtime._selected is None, f"an import selected {runtime._selected!r}"
try:
    import paddle_mla.models.deepseek
except ImportError as exc:
    assert "runtime.select()" in str(exc), exc
else:
    raise AssertionError("a tensor module imported before the runtime was chosen")
assert runtime._selected is None

from paddle_mla.config.schema import config_from_dict
from paddle_mla.engine.llm import LLM
from paddle_mla.sched.request import GenerationRequest, SamplingParams
want = sys.argv[1]
llm = LLM(config_from_dict({"runtime": want, "device": "cpu", "dtype": "float32",
                            "cache": {"block_size": 8, "num_blocks": 32},
                            "scheduler": {"max_num_seqs": 2, "max_num_batched_tokens": 64}}))
out = llm.generate([GenerationRequest(id=0, prompt_token_ids=[5, 6, 7], params=SamplingParams(max_tokens=3))],
                   use_tqdm=False)[0]
kind = type(llm.runner.kv_caches[0]).__module__.split(".")[0]
print("RESULT", runtime.name(), kind, len(out.token_ids))
"""


@pytest.mark.skipif(runtime.name() != "torch", reason="runs once, in the torch pass (starts both runtimes itself)")
@pytest.mark.parametrize("env_says, engine_picks", [("torch", "paddle"), ("paddle", "torch")])
def test_imports_first_then_the_engine_picks_the_other_runtime(env_says, engine_picks):
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddle is not installed")
    env = dict(os.environ, PADDLE_MLA_RUNTIME=env_says, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", SCRIPT, engine_picks], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    _, name, tensor_module, num_tokens = line.split()
    assert name == engine_picks
    assert tensor_module == engine_picks       # the KV cache is a paddle.Tensor / torch.Tensor
    assert num_tokens == "3"
