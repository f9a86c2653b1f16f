"""The RunPlan: every start-up decision made once (worker/plan.py), and what is built from it.

The plan resolves the device, dtype, quantization, backend, KV layout, memory budget, graph sizes
and max_model_len from the config and the checkpoint's architecture; the run line is a view of it,
``validate`` prints it, and the model runner builds from it. One model call (``run_model``) serves
the steps and the memory profile's dummy steps; CUDA graphs capture its ``_forward_meta``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers.cli_harness import ROOT, invoke

from paddle_mla.config.schema import ConfigError, config_from_dict
from paddle_mla.models import ensure_tiny_model, load_arch, parse_arch
from paddle_mla.platform import runtime
from paddle_mla.worker import plan as plans

QWEN3 = dict(model_type="qwen3", vocab_size=101, num_hidden_layers=2, max_position_embeddings=256, hidden_size=48,
             intermediate_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=12, bos_token_id=0,
             eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
CPU = {"device": "cpu", "cache": {"block_size": 16, "num_blocks": 64},
       "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 256, "enable_chunked_prefill": True}}


def _tiny_arch():
    return load_arch(ensure_tiny_model())


def test_tiny_on_cpu_resolves_every_auto():
    arch = _tiny_arch()
    plan = plans.resolve_plan(config_from_dict(CPU), arch)
    assert (plan.runtime, plan.runtime_version) == (runtime.name(), runtime.version())
    assert (plan.device, plan.device_name, plan.dtype, plan.quantization) == ("cpu", None, "float32", "none")
    assert plan.backend == plan.config.attention.backend == "native" and plan.config.device == "cpu"
    assert (plan.model_type, plan.family) == ("deepseek_v3", "mla")
    assert plan.kv == plans.KVLayout(plans.MLA_LATENT, arch.num_layers, arch.mla.latent_dim, 0, None)
    assert plan.kv.table_heads == 0
    assert plan.max_model_len == arch.max_position_embeddings     # chunked prefill: the model's limit
    assert plan.memory == plans.MemoryPlan(16, 64, 0.9, -(-plan.max_model_len // 16))
    assert plan.cuda_graph_sizes == () and not plan.use_cuda_graph
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.dtype = "bfloat16"


def test_the_rules_are_made_once_here():
    assert plans.dtype_name("auto", "cpu") == "float32" and plans.dtype_name("auto", "gpu") == "bfloat16"
    assert plans.dtype_name("float16", "cpu") == "float16"
    assert plans.capture_sizes(5) == (1, 2, 4, 5) and plans.capture_sizes(1) == (1,)
    on = config_from_dict({"cuda_graph": True, "scheduler": {"max_num_seqs": 8}})
    auto = config_from_dict({"scheduler": {"max_num_seqs": 8}})
    assert plans.graph_sizes(auto, "gpu", "triton_mla") == (1, 2, 4, 8)
    assert plans.graph_sizes(auto, "gpu", "native") == () and plans.graph_sizes(auto, "cpu", "triton_mla") == ()
    assert plans.graph_sizes(on, "gpu", "append_attn") == (1, 2, 4, 8)
    # cuda_graph: true where graphs cannot run: rejected by the capability check, before any build
    with pytest.raises(ConfigError, match="cuda_graph: true"):
        plans.resolve_plan(config_from_dict({**CPU, "cuda_graph": True, "device": "auto"}), _tiny_arch())
    no_chunks = config_from_dict({"scheduler": {"max_num_batched_tokens": 100}})
    assert plans.resolve_max_model_len(no_chunks, 2048) == 100   # a prompt runs whole in one step
    with pytest.raises(ValueError, match="max_position_embeddings"):
        plans.resolve_max_model_len(config_from_dict({"max_model_len": 4096}), 2048)


def test_a_named_device_is_planned_on_any_machine():
    """``validate`` plans device: gpu where there is no GPU: the GPU rules apply (bfloat16, triton_mla,
    graphs), nothing asks the machine for a GPU."""
    cfg = config_from_dict({"device": "gpu", "attention": {"backend": "triton_mla"},
                            "scheduler": {"max_num_seqs": 4}})
    plan = plans.resolve_plan(cfg, _tiny_arch(), device_kind="gpu")
    assert (plan.device, plan.dtype, plan.backend, plan.cuda_graph_sizes) == ("gpu", "bfloat16", "triton_mla",
                                                                              (1, 2, 4))


def test_an_fp8_cache_on_a_gpu_without_fp8_is_refused_at_planning(monkeypatch):
    """cache.dtype fp8_e4m3 needs FP8 conversions on the GPU (8.9+): the plan refuses it, before any
    weight is read; a CPU plan, and a GPU config planned on a machine without one, pass."""
    from paddle_mla.models import fp8

    cfg = config_from_dict({**CPU, "cache": {**CPU["cache"], "dtype": "fp8_e4m3"}})
    assert plans.resolve_plan(cfg, _tiny_arch()).kv.fp8
    gpu = dataclasses.replace(cfg, device="gpu", attention=dataclasses.replace(cfg.attention, backend="triton_mla"))
    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    assert plans.resolve_plan(gpu, _tiny_arch(), device_kind="gpu").kv.fp8
    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(runtime, "device_name", lambda: "an sm80 GPU")
    monkeypatch.setattr(fp8, "fp8_kernels_available", lambda kind: (False, "compute capability 8.0"))
    with pytest.raises(ValueError, match="cache.dtype fp8_e4m3 cannot run on this GPU: compute capability 8.0"):
        plans.resolve_plan(gpu, _tiny_arch(), device_kind="gpu")


def test_gqa_layout_with_head_wise_swa_and_tensor_parallel_share():
    arch = parse_arch(QWEN3)
    swa = {**CPU, "attention": {"head_wise_swa_ratio": 0.5, "sliding_window": 32, "sink_tokens": 4}}
    plan = plans.resolve_plan(config_from_dict(swa), arch)
    assert (plan.family, plan.kv.kind, plan.backend) == ("gqa", plans.GQA_HEAD_MAJOR, "native")
    assert plan.kv.width == 2 * 4 * 12 and plan.kv.table_heads == 4
    assert (plan.kv.swa.num_kv_heads, plan.kv.swa.num_swa_heads, plan.kv.swa.window) == (4, 2, 32)
    tp = plans.resolve_plan(config_from_dict({**CPU, "parallel": {"tensor_parallel_size": 2}}), arch)
    assert tp.kv.width == 2 * 2 * 12 and tp.kv.swa is None       # a rank holds its half of the KV heads


def test_a_backend_that_cannot_run_the_checkpoint_is_rejected_before_any_build():
    cfg = config_from_dict({**CPU, "attention": {"backend": "append_attn"}})
    with pytest.raises(ConfigError, match="checkpoint is MLA"):
        plans.resolve_plan(cfg, _tiny_arch())
    with pytest.raises(ConfigError, match="head-wise sliding-window"):
        plans.resolve_plan(config_from_dict({**CPU, "attention": {"head_wise_swa_ratio": 0.5, "sliding_window": 8}}),
                           _tiny_arch())


def test_run_line_and_validate_are_views_of_the_plan():
    from paddle_mla.engine.run_info import describe_run, plan_run, run_info

    cfg = config_from_dict(CPU)
    plan = plan_run(cfg)
    info, resolved = describe_run(cfg)
    assert info == run_info(plan) and resolved == plan.config
    assert (info.device, info.dtype, info.backend) == (plan.device, plan.dtype, plan.backend)
    res = invoke(["validate", str(ROOT / "configs/tiny.yaml"), "--set", "device=cpu"])
    assert res.exit_code == 0, res.stderr
    assert "# plan:" in res.stdout and f"#   runtime: {runtime.name()}" in res.stdout
    assert "#     kind: mla_latent" in res.stdout and "#   cuda_graph_sizes: []" in res.stdout
    # a bench config's stand-in model cannot run its GQA backend: noted, not a config error
    res = invoke(["validate", str(ROOT / "configs/bench/swa_headwise.yaml")])
    assert res.exit_code == 0, res.stderr
    assert "# plan: not resolved with this checkpoint" in res.stdout and "runs GQA models" in res.stdout


def test_the_runner_is_built_from_the_plan():
    from paddle_mla.worker.model_runner import ModelRunner

    cfg = config_from_dict({**CPU, "max_model_len": 512})
    plan = plans.resolve_plan(cfg, _tiny_arch())
    runner = ModelRunner(cfg, str(ensure_tiny_model()), plan=plan)
    assert runner.plan is plan and runner.cfg is plan.config
    assert str(runner.dtype).rsplit(".", 1)[-1] == plan.dtype and runner.backend.name == plan.backend
    assert (runner.limits.max_model_len, runner.limits.num_blocks, runner.limits.max_blocks_per_seq) == (512, 64, 32)
    assert runner.graphs is None and not runner.use_cuda_graph()
    assert runner.inputs.tables.shape == (4, 32)
    assert ModelRunner(cfg, str(ensure_tiny_model())).plan == plan     # resolved the same way without one


def test_one_model_call_serves_the_steps_and_the_profile(monkeypatch):
    """``forward_step`` and the memory profile's dummy step both go through ``run_model``; the
    sampler's arrays come back apart from the attention metadata."""
    from paddle_mla.attention.forward_meta import ForwardMeta, SideArrays
    from paddle_mla.worker import memory_profile as mp
    from paddle_mla.worker.model_runner import ModelRunner

    runner = ModelRunner(config_from_dict(CPU), str(ensure_tiny_model()))
    calls = []
    real = runner.run_model
    monkeypatch.setattr(runner, "run_model", lambda *a, **k: (calls.append(k), real(*a, **k))[1])
    batch = mp.dummy_prefill_batch(40, 4, 32, 16, runner.arch.vocab_size)
    step_logits = runner.forward_step(batch)
    caches = runner.kv_caches
    dummy_logits = mp.run_dummy_step(runner, batch, caches, 4)
    assert len(calls) == 2 and calls[1]["logits_rows"] == 4 and calls[1]["kv_caches"] is caches
    a, b = step_logits.cpu().numpy(), dummy_logits.cpu().numpy()
    assert a.shape == (len(batch.num_new), runner.arch.vocab_size) and b.shape == (4, runner.arch.vocab_size)
    # the sampling rows, repeated to 4 (the LM head's GEMM over 4 rows may round differently)
    np.testing.assert_allclose(b, np.resize(a, b.shape), rtol=1e-5, atol=1e-5)

    side = SideArrays(sampler={"temps": np.full(len(batch.num_new), 0.5, dtype=np.float32)},
                      sample_slots=np.arange(len(batch.num_new), dtype=np.int64))
    _, meta, dev = real(batch, side)
    assert not hasattr(meta, "extra") and isinstance(meta, ForwardMeta)
    assert set(dev.sampler) == {"temps"} and dev.pending_pos is None and dev.pending_slot is None
    np.testing.assert_array_equal(dev.sampler["temps"].cpu().numpy(), side.sampler["temps"])
    np.testing.assert_array_equal(dev.sample_slots.cpu().numpy(), side.sample_slots)


@pytest.mark.gpu
def test_graphs_capture_the_runners_model_call_and_replay_its_logits():
    """On a GPU with triton_mla: graphs for the plan's sizes; a decode step replayed through a graph
    gives the logits of the same step run eagerly through ``_forward_meta``."""
    from paddle_mla.attention.forward_meta import ForwardMeta
    from paddle_mla.worker import memory_profile as mp
    from paddle_mla.worker.model_runner import ModelRunner

    if not runtime.gpu_available():
        pytest.skip("needs a GPU")
    cfg = config_from_dict({"device": "gpu", "dtype": "float32", "attention": {"backend": "triton_mla"},
                            "cache": {"block_size": 16, "num_blocks": 64},
                            "scheduler": {"max_num_seqs": 5, "max_num_batched_tokens": 256}})
    runner = ModelRunner(cfg, str(ensure_tiny_model()))
    assert runner.plan.cuda_graph_sizes == (1, 2, 4, 5) and runner.graphs.sizes == [1, 2, 4, 5]
    # three first-token decodes, each in its own block: a row attends to its own key alone, so the
    # replay and the eager run read what they wrote, whatever the cache held before
    batch = mp.dummy_decode_batch(3, runner.arch.vocab_size)
    batch.num_cached[:] = 0
    batch.block_tables = np.arange(3, dtype=np.int32)[:, None]
    replayed = runner.forward_step(batch).cpu().numpy()       # the 4-graph, one padded row
    eager = runner._forward_meta(ForwardMeta.build(batch, 16, runner.device), rows=None).cpu().numpy()
    np.testing.assert_allclose(replayed, eager, rtol=1e-4, atol=1e-4)
