"""The engine step on a GPU: no hidden host-device syncs, CUDA-graph padding, overlap.

- Decode and mixed (decode + prefill chunk) steps run whole under
  ``torch.cuda.set_sync_debug_mode("error")``: any blocking copy or stream sync raises. The one
  read of the sampled tokens waits on its own event (not a stream sync) and is counted: one per step.
- CUDA graphs with ``max_num_seqs`` 5 (captured 1, 2, 4, 5): decode batches of 3 (padded to 4)
  and 5 replay graphs and give the tokens of the eager run.
- Overlapped scheduling on and off give identical tokens (greedy and seeded sampling).
"""

from __future__ import annotations

import os
import random

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

import pytest  # noqa: E402

from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from test_engine_overlap import completions, mixed_workload  # noqa: E402

pytestmark = pytest.mark.gpu


def make_llm(dtype="float32", graph=True, overlap=True, chunked=True, max_num_seqs=5) -> LLM:
    return LLM(config_from_dict({
        "device": "gpu", "dtype": dtype, "cuda_graph": graph, "attention": {"backend": "triton_mla"},
        "cache": {"block_size": 16, "num_blocks": 256, "enable_prefix_caching": True},
        "scheduler": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 24 if chunked else 1024,
                      "enable_chunked_prefill": chunked, "overlap": overlap}}))


def requests(vocab: int, n: int, seed: int = 0, max_tokens: int = 12) -> list[GenerationRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(7 + 9 * i)]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        if i % 2:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.8, top_k=30, top_p=0.9,
                                    seed=i, logprobs=True, top_logprobs=3, min_tokens=2)
        out.append(GenerationRequest(i, prompt, params))
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_steps_do_not_sync(monkeypatch, overlap):
    llm = make_llm(dtype="bfloat16", overlap=overlap)
    reqs = requests(llm.runner.arch.vocab_size, 5)
    expected = [o.token_ids for o in llm.generate(reqs, use_tqdm=False)]    # warm-up: kernels compiled
    reads, kinds = [], set()
    real_read, real_step, real_launch = sampler.read_to_host, llm._step, llm.runner.launch
    monkeypatch.setattr(sampler, "read_to_host", lambda t: reads.append(1) or real_read(t))

    def launch(out):
        kinds.add("mixed" if any(s.is_prefill for s in out.scheduled) and not all(s.is_prefill for s in out.scheduled)
                  else "prefill" if out.scheduled[0].is_prefill else "decode")
        return real_launch(out)

    def step(finished):
        torch.cuda.set_sync_debug_mode("error")
        try:
            real_step(finished)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(llm.runner, "launch", launch)
    monkeypatch.setattr(llm, "_step", step)
    llm.reset_stats()
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.token_ids for o in outs] == expected
    assert {"decode", "mixed"} <= kinds
    assert len(reads) == llm.stats().steps > 0


def test_cuda_graph_padding_matches_eager():
    """max_num_seqs 5: graphs for 1, 2, 4, 5; 3 running requests replay the 4-graph (one padded
    row), 5 the 5-graph; tokens equal those of the run without graphs."""
    tokens, replays = {}, []
    for graph in (False, True):
        llm = make_llm(graph=graph, overlap=False, chunked=False)
        if graph:
            assert llm.runner.graphs.sizes == [1, 2, 4, 5]
            real = llm.runner.graphs.run

            def run(meta, real=real, sizes=llm.runner.graphs.sizes):
                replays.append((meta.num_reqs, next(s for s in sizes if s >= meta.num_reqs)))
                return real(meta)

            llm.runner.graphs.run = run
        vocab = llm.runner.arch.vocab_size
        tokens[graph] = [[o.token_ids for o in llm.generate(requests(vocab, n, seed=n), use_tqdm=False)]
                         for n in (3, 5)]
    assert tokens[True] == tokens[False]
    assert (3, 4) in replays and (5, 5) in replays


def test_overlap_on_off_same_tokens():
    runs = []
    for overlap in (False, True):
        llm = make_llm(overlap=overlap)
        assert llm.overlap is overlap
        runs.append(completions(llm.generate(mixed_workload(llm.runner.arch.vocab_size), use_tqdm=False)))
    assert runs[1][0] == runs[0][0]
    assert runs[1][1] == pytest.approx(runs[0][1], abs=1e-4)


def test_overlap_auto_is_on_for_gpu():
    assert make_llm(overlap="auto").overlap is True
