"""Runs the CLI in-process (click's CliRunner) against the real engine or the fake one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from paddle_mla import cli

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
REAL_ENGINE = importlib.util.find_spec("paddle_mla.tokenizer") is not None and \
    importlib.util.find_spec("paddle_mla.engine.llm") is not None

ENGINES = ["fake", pytest.param("real", marks=pytest.mark.skipif(
    not REAL_ENGINE, reason="the real engine (paddle_mla.engine.llm + paddle_mla.tokenizer) is not there yet"))]


def invoke(args: list[str], engine: str = "real", monkeypatch=None, input: bytes | None = None, **fake_kw):
    """Run `paddle-mla ARGS`; engine 'fake' swaps in tests/fake_llm.FakeLLM (needs monkeypatch)."""
    if engine == "fake":
        from fake_llm import FakeLLM

        fake_kw.setdefault("fail_over", None)
        monkeypatch.setattr(cli, "build_llm", lambda cfg: FakeLLM(cfg, **fake_kw))
    return CliRunner().invoke(cli.main, args, input=input, catch_exceptions=False)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]
