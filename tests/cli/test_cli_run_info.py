"""Say what ran: the first stderr line of generate and bench, the --summary and
bench JSON, runtime auto (a GPU runtime, else torch, else paddle) and attention.backend auto."""

import json
import re

import pytest
from helpers.cli_harness import REAL_ENGINE, ROOT, invoke

from paddle_mla.config import backends as backend_caps
from paddle_mla.platform import runtime
from paddle_mla.config.schema import ConfigError, EngineConfig, load_config

RUN_LINE = re.compile(r"^paddle-mla: runtime (torch|paddle) (\S+), device cpu, dtype float32, backend native, "
                      r"model tiny \((/\S+)\)$")
needs_real = pytest.mark.skipif(not REAL_ENGINE, reason="needs the real engine")


@needs_real
def test_generate_first_line_and_summary_name_what_ran(tmp_path):
    summary = tmp_path / "s.json"
    res = invoke(["generate", "--no-progress", "--max-tokens", "2", "--summary", str(summary)],
                 input=b'{"id": 1, "prompt": "Hello"}\n')
    assert res.exit_code == 0, res.stderr
    first = res.stderr.splitlines()[0]
    m = RUN_LINE.match(first)
    assert m, first
    assert m.group(1) == runtime.name() and m.group(2) == runtime.version()
    s = json.loads(summary.read_text())
    assert {k: s[k] for k in ("runtime", "runtime_version", "device", "device_name", "dtype", "backend", "model",
                              "model_path")} == {
        "runtime": runtime.name(), "runtime_version": runtime.version(), "device": "cpu", "device_name": None,
        "dtype": "float32", "backend": "native", "model": "tiny", "model_path": m.group(3)}
    assert s["interrupted"] is False


@needs_real
def test_run_line_is_what_the_engine_loads(tmp_path):
    """The line is printed before the weights load; the loaded engine's own description agrees."""
    from paddle_mla.engine.llm import LLM
    from paddle_mla.engine.run_info import describe_run

    cfg = load_config(None, ("dtype=float32",))
    before, resolved = describe_run(cfg)
    llm = LLM(cfg)
    assert llm.describe() == before.to_dict()
    assert resolved.attention.backend == llm.config.attention.backend == "native"


@needs_real
def test_bench_first_line_and_json_name_what_ran(tmp_path):
    out = tmp_path / "b.json"
    res = invoke(["bench", "--workload", "random:num_prompts=2,input_len=8,output_len=2", "--repeats", "1",
                  "--warmup", "1", "--json", str(out)])
    assert res.exit_code == 0, res.stderr
    assert RUN_LINE.match(res.stderr.splitlines()[0]), res.stderr
    doc = json.loads(out.read_text())
    assert (doc["runtime"], doc["runtime_version"], doc["device"]) == (runtime.name(), runtime.version(), "cpu")
    run = doc["configs"][0]["run"]
    assert (run["dtype"], run["backend"], run["model"]) == ("float32", "native", "tiny")


@pytest.mark.parametrize("installed,torch_gpu,paddle_gpu,want", [
    ({"torch", "paddle"}, False, False, "torch"),     # CPU: torch (~3.8x faster than Paddle's proxy here)
    ({"paddle"}, False, False, "paddle"),
    ({"torch"}, False, False, "torch"),
    ({"torch", "paddle"}, False, True, "paddle"),     # the runtime that sees a GPU
    ({"torch", "paddle"}, True, True, "torch"),
    ({"torch", "paddle"}, True, False, "torch"),
])
def test_runtime_auto_prefers_a_gpu_runtime_then_torch(monkeypatch, installed, torch_gpu, paddle_gpu, want):
    monkeypatch.setattr(runtime, "_installed", lambda name: name in installed)
    monkeypatch.setattr(runtime, "_torch_sees_gpu", lambda: torch_gpu)
    monkeypatch.setattr(runtime, "_paddle_sees_gpu", lambda: paddle_gpu)
    monkeypatch.setattr(runtime, "_paddle_is_cpu_build", lambda: not paddle_gpu)
    assert runtime._resolve_auto() == want


def test_runtime_auto_does_not_import_a_cpu_paddle_to_look_for_a_gpu():
    import subprocess
    import sys

    code = ("import sys; from paddle_mla.platform import runtime; runtime._installed = lambda n: True; "
            "runtime._torch_sees_gpu = lambda: False; print(runtime._resolve_auto(), 'paddle' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    if runtime._installed("paddle") and runtime._paddle_is_cpu_build():
        assert out.split() == ["torch", "False"]


def test_attention_backend_auto_is_the_default_and_resolves_per_device(monkeypatch):
    assert EngineConfig().attention.backend == "auto"
    assert backend_caps.resolve_backend("auto", "cpu") == "native"
    assert backend_caps.resolve_backend("native", "gpu") == "native"
    monkeypatch.setattr(backend_caps.importlib.util, "find_spec", lambda name: object())
    assert backend_caps.resolve_backend("auto", "gpu") == "triton_mla"
    assert backend_caps.resolve_backend("auto", "gpu", "deepseek_v3") == "triton_mla"
    assert backend_caps.resolve_backend("auto", "gpu", "deepseek_v32") == "dsa"     # sparse attention needs dsa
    assert backend_caps.resolve_backend("auto", "cpu", "deepseek_v32") == "native"
    monkeypatch.setattr(backend_caps.importlib.util, "find_spec", lambda name: None)
    assert backend_caps.resolve_backend("auto", "gpu") == "native"       # no triton: native on the GPU


def test_resolved_backend_is_validated_before_loading():
    cfg = load_config(None, ("cuda_graph=true",))          # fine while the device is unknown ...
    with pytest.raises(ConfigError) as info:
        backend_caps.resolved_config(cfg, "cpu")           # ... not once it resolves to CPU
    assert "auto resolved to 'native' on cpu" in info.value.errors[0]
    assert backend_caps.resolved_config(load_config(), "cpu").attention.backend == "native"


def test_validate_checks_auto_where_the_device_is_given():
    res = invoke(["validate", str(ROOT / "configs/tiny.yaml"), "--set", "device=cpu", "--set", "cuda_graph=true"])
    assert res.exit_code == 2 and "cuda_graph" in res.stderr
    res = invoke(["validate", str(ROOT / "configs/tiny.yaml"), "--set", "attention.backend=auto"])
    assert res.exit_code == 0, res.stderr
