"""The tiny model: deterministic bytes, cached build (race-safe), and it runs like HF would run it."""

import hashlib
import json
import threading

import numpy as np
import pytest
from helpers.model_harness import run_greedy

from paddle_mla.models import ensure_tiny_model, load_model, make_tiny_model
from paddle_mla.models.tiny import tiny_cache_dir
from paddle_mla.platform.tensor_api import torch
from paddle_mla.engine.tokenizer import Tokenizer


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.parametrize("arch", ["deepseek_v3", "deepseek_v2"])
def test_same_seed_same_bytes(tmp_path, arch):
    a = make_tiny_model(tmp_path / "a", arch=arch, seed=0)
    b = make_tiny_model(tmp_path / "b", arch=arch, seed=0)
    c = make_tiny_model(tmp_path / "c", arch=arch, seed=1)
    assert _digest(a) == _digest(b) != _digest(c)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["model_type"] == arch
    assert cfg["vocab_size"] == Tokenizer.from_dir(a).vocab_size


def test_ensure_builds_once_and_reuses(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_MLA_CACHE", str(tmp_path))
    results, errors = [], []

    def build():
        try:
            results.append(ensure_tiny_model())
        except (OSError, ValueError, RuntimeError) as e:  # reported by the assert below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    path = results[0]
    assert path == tiny_cache_dir() and path.parent == tmp_path
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]        # no temp folders left behind


@pytest.mark.parametrize("arch", ["deepseek_v3", "deepseek_v2"])
def test_tiny_generates_like_hf(tmp_path, arch):
    """Our run of the tiny checkpoint == transformers' run of the same folder (greedy, 8 tokens)."""
    transformers = pytest.importorskip("transformers")
    real_torch = pytest.importorskip("torch")
    path = make_tiny_model(tmp_path / arch, arch=arch)
    tok = Tokenizer.from_dir(path)
    prompts = [tok.encode("Hello, world!"), tok.encode("The capital of France is"), tok.encode("Once")]
    model = load_model(str(path), torch.float32, "cpu")
    ours = run_greedy(model, prompts, 8, block_size=4, chunk=3)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    for r, p in enumerate(prompts):
        ids = list(p)
        with real_torch.no_grad():
            for step in range(8):
                logits = hf(real_torch.tensor([ids])).logits[0, -1].float().numpy()
                if step == 0:
                    np.testing.assert_allclose(ours.first_logits[r], logits, atol=1e-4, rtol=0)
                    top2 = np.sort(logits)[-2:]
                    assert top2[1] - top2[0] > 1e-3          # not a near tie
                ids.append(int(np.argmax(logits)))
        assert ours.tokens[r] == ids[len(p):]
    assert len({t for toks in ours.tokens for t in toks}) > 3   # not a degenerate repeat of one token
