"""Runs the CLI in-process (click's CliRunner) against the real engine or the fake one."""

from __future__ import annotations

import functools
import importlib.util
import json
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from paddle_mla.cli import app as cli

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"
REAL_ENGINE = importlib.util.find_spec("paddle_mla.engine.tokenizer") is not None and \
    importlib.util.find_spec("paddle_mla.engine.llm") is not None

ENGINES = ["fake", pytest.param("real", marks=pytest.mark.skipif(
    not REAL_ENGINE, reason="the real engine (paddle_mla.engine.llm + paddle_mla.engine.tokenizer) is not there yet"))]


def default_sigint() -> None:
    """``preexec_fn`` of a CLI subprocess a test will interrupt: a test run launched in the
    background (``cmd &`` in a script) inherits SIGINT ignored, and the CLI keeps an ignored SIGINT
    ignored, so give it the default a terminal would."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def invoke(args: list[str], engine: str = "real", monkeypatch=None, input: bytes | None = None, **fake_kw):
    """Run `paddle-mla ARGS`; engine 'fake' swaps in tests/fake_llm.FakeLLM (needs monkeypatch)."""
    if engine == "fake":
        from helpers.fake_llm import FakeLLM

        fake_kw.setdefault("fail_over", None)
        monkeypatch.setattr(cli, "build_llm", lambda cfg: FakeLLM(cfg, **fake_kw))
    return CliRunner().invoke(cli.main, args, input=input, catch_exceptions=False)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


@functools.lru_cache(maxsize=None)
def _engine_probe() -> dict[str, bool]:
    """Which output features the real engine delivers (some land with the sampler work): one short
    run of the tiny model with n=2, logprobs with 2 alternatives, and max_tokens past max_model_len."""
    from paddle_mla.config.schema import load_config
    from paddle_mla.engine.llm import LLM
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    llm = LLM(load_config(None, ("max_model_len=8",)))
    params = SamplingParams(max_tokens=50, n=2, logprobs=True, top_logprobs=2, seed=1, temperature=1.0)
    out = llm.generate([GenerationRequest(0, [5, 6, 7], params)], use_tqdm=False)[0]
    lps = out.outputs[0].logprobs if out.outputs else None
    return {"n": len(out.outputs) == 2,
            "logprobs": bool(lps) and len(lps) == len(out.outputs[0].token_ids) and len(lps[0].top) == 2,
            "warnings": any("max_tokens" in w for w in out.warnings)}


def engine_supports(feature: str) -> bool:
    return REAL_ENGINE and _engine_probe()[feature]


def skip_unless_engine(feature: str):
    """Skip a real-engine test until the engine delivers ``feature`` (n / logprobs / warnings)."""
    reasons = {"n": "the engine does not return n > 1 completions yet (sampler branch)",
               "logprobs": "the engine does not return logprobs yet (sampler branch)",
               "warnings": "the engine does not put the max_tokens cut warning on RequestOutput.warnings yet "
                           "(sampler branch)"}
    if not engine_supports(feature):
        pytest.skip(reasons[feature])
