"""Paddle's torch proxy stays scoped when the real torch is installed too (README, Runtimes):
inside paddle_mla ``import torch`` is Paddle; the user's own ``import torch``, and the one
transformers makes, is the real torch, even when it comes after ``runtime.select('paddle')``.

Before runtime.py imported the real torch ahead of the proxy, torch >= 2.14 died there with
``KeyError: 'torch._native.ops.bmm_outer_product'``: its import probes ``find_spec("triton")``,
triton is in the proxy's scope, and the proxy's lookup of a scoped module moves every ``torch*``
entry out of ``sys.modules``, half-imported ones included.

Runs in a fresh interpreter (the runtime is chosen once per process), once, in the paddle pass.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from paddle_mla.platform import runtime

SCRIPT = r"""
import paddle
from paddle_mla.platform import runtime
runtime.select("paddle")
from paddle_mla.platform.tensor_api import torch as ours

import transformers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM  # imports the real torch
import torch

assert torch is not ours
assert isinstance(torch.ones(2), torch.Tensor) and not isinstance(torch.ones(2), paddle.Tensor)
assert torch.__file__.endswith("torch/__init__.py") and hasattr(torch, "_C")
hf = DeepseekV3ForCausalLM(DeepseekV3Config(
    vocab_size=32, hidden_size=16, intermediate_size=24, moe_intermediate_size=8, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4,
    qk_nope_head_dim=4, v_head_dim=4, n_routed_experts=2, num_experts_per_tok=1, n_group=1, topk_group=1,
    first_k_dense_replace=1))
with torch.no_grad():
    logits = hf(torch.tensor([[1, 2, 3]])).logits
assert isinstance(logits, torch.Tensor) and tuple(logits.shape) == (1, 3, 32)

# paddle_mla modules imported after the user's torch still get Paddle.
import paddle_mla.ops.reference as reference
assert isinstance(ours.ones(2), paddle.Tensor)
assert isinstance(reference.torch.ones(2), paddle.Tensor)
print("PROXY-OK")
"""


@pytest.mark.skipif(runtime.name() != "paddle", reason="runs once, in the paddle pass")
def test_user_torch_stays_real_next_to_the_paddle_proxy(tmp_path):
    for needed in ("torch", "transformers"):
        if importlib.util.find_spec(needed) is None:
            pytest.skip(f"{needed} is not installed")
    env = dict(os.environ)
    env.pop("PADDLE_MLA_RUNTIME", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0 and "PROXY-OK" in done.stdout, done.stderr[-4000:]
