"""Data parallel on 2 GPUs (run by scripts/gpu_scale_out.sh on a machine with two or more): the DP=2 output
file of the triton_mla config in fp32 equals the DP=1 file, and the replicas (2, and 4 where 4 GPUs are
visible) sit on different GPUs and each take work."""

import json

import pytest
from helpers.cli_harness import ROOT, invoke, read_jsonl
from helpers.gpus import sizes

from paddle_mla.platform import runtime

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(runtime.gpu_count() < 2, reason="needs 2 GPUs")]


def test_dp2_file_equals_dp1_on_two_gpus(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "prompt": f"Request {i}: " + "abc " * (i % 9)}) + "\n"
                           for i in range(48)))
    common = ["generate", "--config", str(ROOT / "configs/triton_mla.yaml"), "-i", str(inp), "--no-progress",
              "--set", "sampling.max_tokens=16", "--set", "dtype=float32"]
    res = invoke([*common, "-o", str(tmp_path / "dp1.jsonl")])
    assert res.exit_code == 0, res.stderr
    summary = tmp_path / "s.json"
    res = invoke([*common, "-o", str(tmp_path / "dp2.jsonl"), "--set", "parallel.data_parallel_size=2",
                  "--summary", str(summary)])
    assert res.exit_code == 0, res.stderr
    assert read_jsonl(tmp_path / "dp2.jsonl") == read_jsonl(tmp_path / "dp1.jsonl")
    assert json.loads(summary.read_text())["data_parallel_size"] == 2


@pytest.mark.parametrize("dp", sizes("dp", 2, 4))
def test_replicas_get_one_gpu_each(dp):
    from paddle_mla.config.schema import load_config
    from paddle_mla.sched.request import GenerationRequest, SamplingParams
    from paddle_mla.integrations.data_parallel import DataParallelLLM

    llm = DataParallelLLM(load_config(ROOT / "configs/triton_mla.yaml", (f"parallel.data_parallel_size={dp}",)))
    try:
        assert len({r.env["CUDA_VISIBLE_DEVICES"] for r in llm.replicas}) == dp
        outs = llm.generate([GenerationRequest(i, [5, 6, 7 + i], SamplingParams(max_tokens=4, ignore_eos=True))
                             for i in range(4 * dp)], use_tqdm=False)
        assert [o.id for o in outs] == list(range(4 * dp)) and all(len(o.token_ids) == 4 for o in outs)
        assert all(r.stats.requests > 0 for r in llm.replicas)     # both replicas took work
    finally:
        llm.close()
