"""The GPU side of ``test_tp_shutdown.py``: a TP=2 ``paddle-mla generate`` over NCCL exits within
5 s of its last output line, with and without CUDA graphs (the graphs capture the collectives, so
they must go before the communicator), and leaves no worker behind. Needs 2 GPUs."""

from __future__ import annotations

import pytest
from test_tp_shutdown import check_exits_after_last_line, write_prompts

from paddle_mla.platform import runtime

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(runtime.is_paddle() or runtime.gpu_count() < 2,
                                 reason="needs 2 GPUs and the torch runtime")]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda_graph"])
@pytest.mark.parametrize("backend", ["triton_mla", "native"])
def test_tp2_gpu_exits_soon_after_its_last_line(tmp_path, graph, backend):
    if graph and backend == "native":
        pytest.skip("native runs eager only")
    check_exits_after_last_line(write_prompts(tmp_path / "in.jsonl", 8), "device=gpu",
                                f"cuda_graph={str(graph).lower()}", f"attention.backend={backend}",
                                "sampling.max_tokens=8", "scheduler.max_num_seqs=4")
