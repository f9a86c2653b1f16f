"""The sampler on a GPU: the same tokens and logprobs as on the CPU for fixed logits, the per-slot
penalty state gives the same tokens and counts as on the CPU, and the engine with CUDA graphs (whose
logits are a view into the graph's output) or with overlapped scheduling gives the same penalized,
seeded, n > 1 completions and logprobs as without."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from paddle_mla.platform import runtime  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.worker.penalties import PenaltyState  # noqa: E402
from paddle_mla.worker.sampling_batch import build_sampling_batch, unpack  # noqa: E402
from test_sampler import EOS, PROCESS_ROWS, fixed_logits, make_seq, tensor  # noqa: E402

pytestmark = pytest.mark.gpu


def test_gpu_sampler_matches_cpu():
    vocab = 1000
    rows = [dict(r, temperature=0.9 * (i % 2), seed=i, logprobs=i % 3 == 0, top_logprobs=4 * (i % 3 == 0))
            for i, r in enumerate(PROCESS_ROWS)]
    seqs = []
    for r in rows:
        r = dict(r)
        seq = make_seq(r.pop("prompt"), r.pop("output"), seed=r.pop("seed"), **r)
        seqs.append(seq)
    batch = build_sampling_batch(seqs, EOS, vocab)
    logits = tensor(fixed_logits(len(seqs), vocab, seed=11))
    cpu_ids, cpu_lp = unpack(sampler.read_to_host(sampler.sample_step(logits, batch)), batch)
    gpu = logits.to(runtime.device_string("gpu"))
    gpu_ids, gpu_lp = unpack(sampler.read_to_host(sampler.sample_step(gpu, batch)), batch)
    assert gpu_ids.tolist() == cpu_ids.tolist()
    for a, b in zip(cpu_lp, gpu_lp):
        assert (a is None) == (b is None)
        if a is not None:
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            np.testing.assert_allclose([a.logprob] + [v for _, v in a.top], [b.logprob] + [v for _, v in b.top],
                                       atol=1e-4)


def penalty_steps(device: str, vocab: int = 1000):
    """12 steps of three rows through a PenaltyState on ``device`` (admissions, device counting, a
    row moved to another slot at step 6): the sampled ids per step and the final counts."""
    state = PenaltyState(4, vocab, device)
    seqs = [make_seq([1, 2, 3, 3], seed=1, temperature=0.9, repetition_penalty=1.4, frequency_penalty=0.3),
            make_seq([4, 5], presence_penalty=1.1, frequency_penalty=0.8),
            make_seq([6], seed=2, temperature=1.0)]
    slots = [2, 0, 1]
    rng = np.random.default_rng(0)
    got = []
    for step in range(12):
        if step == 6:
            slots[0] = 3
        logits = rng.standard_normal((3, vocab)).astype(np.float32) * 2
        for row, seq in enumerate(seqs):      # the penalties must move the plain argmax
            if seq.output_token_ids:
                logits[row, seq.output_token_ids[-1]] += 3.0
        batch = build_sampling_batch(seqs, EOS, vocab, slots=np.asarray(slots, dtype=np.int64), ledger=state.ledger)
        packed, _ = sampler.sample_step_ids(tensor(logits).to(device), batch, None, state)
        ids, _ = unpack(sampler.read_to_host(packed), batch)
        for seq, token in zip(seqs, ids.tolist()):
            seq.output_token_ids.append(token)
        got.append(ids.tolist())
    return got, state.output_counts.cpu().numpy()


def test_gpu_penalty_state_matches_cpu():
    cpu_ids, cpu_counts = penalty_steps("cpu")
    gpu_ids, gpu_counts = penalty_steps(runtime.device_string("gpu"))
    assert gpu_ids == cpu_ids
    assert np.array_equal(gpu_counts, cpu_counts) and gpu_counts.sum() == 2 * 12 + 6   # slot 2 keeps 6


def _run(graph: bool, overlap="auto"):
    llm = LLM(config_from_dict({"device": "gpu", "dtype": "float32", "cuda_graph": graph,
                                "attention": {"backend": "triton_mla"},
                                "cache": {"block_size": 16, "num_blocks": 128},
                                "scheduler": {"max_num_seqs": 8, "overlap": overlap}}))
    reqs = [GenerationRequest(0, [5, 6, 7, 8], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=10,
                                                              ignore_eos=True, logprobs=True, top_logprobs=3,
                                                              repetition_penalty=1.3, frequency_penalty=0.5)),
            GenerationRequest(1, [9, 10, 11], SamplingParams(max_tokens=10, min_tokens=5, stop_token_ids=[1, 2, 3],
                                                             presence_penalty=1.0, logprobs=True))]
    return llm.generate(reqs, use_tqdm=False)


def test_cuda_graph_sampling_matches_eager():
    eager, graphed = _run(False), _run(True)
    for a, b in zip(eager, graphed):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        for ca, cb in zip(a.outputs, b.outputs):
            np.testing.assert_allclose([lp.logprob for lp in ca.logprobs], [lp.logprob for lp in cb.logprobs],
                                       atol=1e-3)


def test_overlapped_penalties_match_the_plain_loop():
    """Penalized decode rows launch while their last token is pending: same completions as the plain loop."""
    plain, overlapped = _run(False, overlap=False), _run(False, overlap=True)
    for a, b in zip(plain, overlapped):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
