"""``benchmarks.e2e.tensor_parallel --profile`` (``benchmarks.e2e.tp_profile``): kernel names fall in
their categories, a trace's step is split into kernels by category, idle gaps and the blocks between
collectives as the arithmetic says (fake traces, no tensor library), the worker's profile messages
set the graphs aside and back, and the whole path runs end to end on CPU at TP=1 and TP=2 (gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.e2e import tp_profile as tpp
from paddle_mla.parallel.worker import ProfileControl, RankProfile
from paddle_mla.platform import runtime

ROOT = Path(__file__).resolve().parents[2]

NAMES = {
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": tpp.COLLECTIVE,
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": tpp.COLLECTIVE,
    "c10d::allreduce_": tpp.COLLECTIVE,
    "void paddle_mla::mla_decode_wgmma_kernel(paddle_mla::MlaDecodeArgs, CUtensorMap_st, CUtensorMap_st)":
        "attention decode (+ plan, cache write)",
    "void paddle_mla::mla_combine_kernel(paddle_mla::MlaDecodeArgs)": "attention decode (+ plan, cache write)",
    "_write_latent_cache_kernel": "attention decode (+ plan, cache write)",
    "_decode_stage1": "attention decode (+ plan, cache write)",
    "grouped_gemm_kernel": "MoE grouped GEMM",
    "sum_topk_kernel": "MoE routing / align / top-k sum",
    "_count_kernel": "MoE routing / align / top-k sum",
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float const, "
    "unsigned int>)": "MoE routing / align / top-k sum",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(float*, float const*, int)":
        "MoE routing / align / top-k sum",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, "
    "long, 4, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4, 4>)":
        "sampling (argmax) / logits",
    "nvjet_tst_128x64_64x8_2x1_v_bz_coopA_TNT": "dense GEMM / linear (incl. lm_head, router)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
    "__5x_cublas": "dense GEMM / linear (incl. lm_head, router)",
    "ampere_sgemm_32x32_sliced1x4_tn": "dense GEMM / linear (incl. lm_head, router)",
    "aten::linear": "dense GEMM / linear (incl. lm_head, router)",
    "_rms_norm_kernel": "norm / rope / elementwise / copies",
    "_rope_kernel": "norm / rope / elementwise / copies",
    "_mla_latent_kernel": "norm / rope / elementwise / copies",
    "_route_kernel": "MoE routing / align / top-k sum",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)":
        "norm / rope / elementwise / copies",
    "Memcpy DtoH (Device -> Pinned)": "norm / rope / elementwise / copies",
    "aten::linear_backward_weird": tpp.OTHER,
    "mystery_kernel": tpp.OTHER,
}


def test_kernel_names_fall_in_their_categories():
    for name, cat in NAMES.items():
        assert tpp.categorize(name) == cat, name
    assert {c for c, _ in tpp.CATEGORIES} <= set(NAMES.values()) | {tpp.OTHER}


def _k(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def _step(i, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"{tpp.STEP_MARK}{i}", "ts": ts, "dur": dur, "pid": 1,
            "tid": 1}


AR, AG = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_AllGather_RING_LL"


def _one_layer_step(t0: float) -> list[dict]:
    """One rank-0 step of a 1-layer TP model, 100 µs long, kernels at known offsets:
    embed AR [10,15), attention [17,30) + decode overlapping [25,35), AR [40,45),
    MoE GEMM [45,60), AR [65,70), lm_head GEMM [70,80), AG [80,84), argmax [90,92)."""
    return [_step(0 if t0 == 0 else 1, t0, 100.0),
            _k(AR, t0 + 10, 5), _k("_rms_norm_kernel", t0 + 17, 13), _k("mla_decode_wgmma_kernel", t0 + 25, 10),
            _k(AR, t0 + 40, 5), _k("grouped_gemm_kernel", t0 + 45, 15), _k(AR, t0 + 65, 5),
            _k("nvjet_tst_lm_head", t0 + 70, 10), _k(AG, t0 + 80, 4), _k("reduce_kernel ArgMaxOps", t0 + 90, 2)]


def test_summary_of_a_fake_two_step_trace():
    events = _one_layer_step(0.0) + _one_layer_step(1000.0) + [_k("outside_any_step", 500.0, 50.0)]
    s = tpp.summarize(events, steps=2, layers=1)
    assert s["kind"] == "gpu" and s["events"] == 18          # the kernel between the steps is not counted
    assert s["wall_us"] == 100.0
    # busy: 5 + [17,35) 18 + 5 + 15 + 5 + 10 + 4 + 2 = 64 (the overlap counted once); the sum counts it twice
    assert s["busy_us"] == pytest.approx(64.0) and s["kernel_sum_us"] == pytest.approx(69.0)
    assert s["idle_before_first_us"] == pytest.approx(10.0)
    assert s["idle_after_last_us"] == pytest.approx(8.0)
    assert s["idle_between_us"] == pytest.approx(82.0 - 64.0)
    cats = s["categories"]
    assert cats[tpp.COLLECTIVE] == {"us": 19.0, "count": 4.0, "share": pytest.approx(0.19)}
    assert cats["MoE grouped GEMM"]["us"] == 15.0 and cats["attention decode (+ plan, cache write)"]["count"] == 1.0
    c = s["collectives"]
    assert c["count"] == 4.0 and c["min_us"] == 4.0 and c["excess_over_min_us"] == pytest.approx(19.0 - 16.0)
    assert c["first_of_step_us"] == 5.0
    # between collectives: attention from the embed AR's end (15) to the next AR (40); the MLP 45 -> 65
    # (layer 0 is the only layer: no MoE layer); final norm + lm_head 70 -> 80
    assert s["blocks"] == {"attention_us_per_layer": 25.0, "mlp_layer0_us": 20.0, "moe_us_per_layer": 0.0,
                           "final_norm_lm_head_us": 10.0}
    assert [row[1] for row in s["sequence"]] == [10.0, 17.0, 25.0, 40.0, 45.0, 65.0, 70.0, 80.0, 90.0]
    top = {k["name"]: (k["us"], k["count"], k["mean_us"]) for k in s["kernels"][:2]}
    assert top == {AR: (15.0, 3.0, 5.0), "grouped_gemm_kernel": (15.0, 1.0, 15.0)}
    # a worker's trace has no step windows: its device span per step, shares of rank 0's step
    worker = [e for e in events if e["cat"] == "kernel" and e["name"] != "outside_any_step"]
    w = tpp.summarize(worker, steps=2, layers=1, step_us=100.0)
    assert w["idle_before_first_us"] is None and w["wall_us"] == pytest.approx((1092.0 - 10.0) / 2)
    assert w["categories"][tpp.COLLECTIVE]["share"] == pytest.approx(0.19)
    assert w["blocks"] == s["blocks"]
    lines = tpp.format_run({"tp": 2, "mode": "graphs", "steps": 2, "step_ms": 0.1, "ranks": [s, w]})
    assert any(line.startswith(f"| {tpp.COLLECTIVE} | 19 | 4 | 19.0% | 19 | 4 | 19.0% |") for line in lines), lines
    one = dict(s, categories={k: v for k, v in s["categories"].items() if k != tpp.COLLECTIVE})
    table = tpp.comparison([{"tp": 1, "mode": "graphs", "ranks": [one]}, {"tp": 2, "mode": "graphs", "ranks": [s]}])
    assert f"| {tpp.COLLECTIVE} | 0 | 19 | +19 |" in table
    assert "| MoE grouped GEMM | 15 | 15 | +8 |" in table      # 15 - 15 / 2: did not shrink


def test_cpu_trace_uses_top_level_ops():
    ops = [_k("aten::linear", 0, 10, "cpu_op"), _k("aten::mm", 1, 8, "cpu_op"), _k("c10d::allreduce_", 12, 3, "cpu_op"),
           dict(_k("aten::add", 0, 4, "cpu_op"), tid=8)]     # another thread: its own top level
    evs, kind = tpp.device_events(ops)
    assert kind == "cpu" and [e[2] for e in evs] == ["aten::add", "aten::linear", "c10d::allreduce_"]


def test_worker_profile_messages_set_the_graphs_aside_and_back():
    runner = SimpleNamespace(graphs="captured", device_kind="cpu")
    prof = RankProfile(1)
    prof.handle(ProfileControl("eager"), runner)
    assert runner.graphs is None
    prof.handle(ProfileControl("eager"), runner)     # twice: still the captured graphs kept
    prof.handle(ProfileControl("graphs"), runner)
    assert runner.graphs == "captured"
    prof.handle(ProfileControl("stop", "/nonexistent/{rank}.json"), runner)   # no profile running: nothing
    assert not Path("/nonexistent/1.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(runtime.is_paddle(), reason="tensor parallel is torch-only")
def test_bench_profile_runs_on_cpu_at_tp1_and_tp2(tmp_path):
    out = tmp_path / "profile.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", PADDLE_MLA_RUNTIME="torch")
    done = subprocess.run([sys.executable, "-m", "benchmarks.e2e.tensor_parallel", "--smoke", "--layers", "2",
                           "--batch", "4", "--context", "64", "--iters", "1", "--prefill-requests", "0", "--e2e", "0",
                           "--profile", "--profile-steps", "2", "--profile-json", str(out),
                           "--profile-traces", str(tmp_path / "traces")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [(r["tp"], r["mode"], len(r["ranks"])) for r in res["runs"]] == [(1, "eager", 1), (2, "eager", 2)]
    for rank in res["runs"][1]["ranks"]:       # every collective of a TP=2 step, seen on both ranks
        assert rank["kind"] == "cpu" and rank["collectives"]["count"] == 2 * 2 + 2
        assert rank["blocks"] is not None
    assert tpp.COLLECTIVE not in res["runs"][0]["ranks"][0]["categories"]
    assert len(list((tmp_path / "traces").glob("trace_tp2_eager_rank*.json.gz"))) == 2
    assert "### Profile: TP=2, eager, 2 steps (cpu)" in done.stdout
    assert "| collective (NCCL all-reduce / all-gather) | 0 |" in done.stdout   # the comparison table
