"""The GPU side of ``test_tp_shutdown.py``, over NCCL at TP=2 and (with 4 GPUs) TP=4: a tensor-parallel
``paddle-mla generate`` exits within 5 s of its last output line, with and without CUDA graphs (the
graphs capture the collectives, so they must go before the communicator), exits 130 promptly on
SIGINT, fails with one line when a worker is killed (the peers sit in NCCL collectives: they are
aborted, not awaited), and leaves no worker behind."""

from __future__ import annotations

import pytest
from helpers.gpus import sizes
from test_tp_shutdown import (check_exits_after_last_line, check_killed_worker_fails_promptly,
                              check_sigint_exits_130_promptly, write_prompts)

from paddle_mla.platform import runtime

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(runtime.is_paddle(), reason="the torch runtime drives the GPUs")]

TP_SIZES = sizes("tp", 2, 4)
# long enough that SIGINT and the kill land mid-run: records stream out over many seconds
GPU_LONG = ("device=gpu", "attention.backend=triton_mla", "sampling.max_tokens=64", "sampling.ignore_eos=true",
            "scheduler.max_num_seqs=2")


@pytest.mark.parametrize("tp", TP_SIZES)
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda_graph"])
@pytest.mark.parametrize("backend", ["triton_mla", "native"])
def test_tp_gpu_exits_soon_after_its_last_line(tmp_path, graph, backend, tp):
    if graph and backend == "native":
        pytest.skip("native runs eager only")
    check_exits_after_last_line(write_prompts(tmp_path / "in.jsonl", 8), "device=gpu",
                                f"cuda_graph={str(graph).lower()}", f"attention.backend={backend}",
                                "sampling.max_tokens=8", "scheduler.max_num_seqs=4", tp=tp)


@pytest.mark.parametrize("tp", TP_SIZES)
def test_tp_gpu_sigint_exits_130_promptly(tmp_path, tp):
    check_sigint_exits_130_promptly(write_prompts(tmp_path / "in.jsonl", 200), *GPU_LONG, tp=tp)


@pytest.mark.parametrize("tp", TP_SIZES)
def test_tp_gpu_killed_worker_fails_promptly(tmp_path, tp):
    check_killed_worker_fails_promptly(write_prompts(tmp_path / "in.jsonl", 200), *GPU_LONG, tp=tp)
