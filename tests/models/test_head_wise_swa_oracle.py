"""Head-wise sliding-window attention through the whole engine against an independent oracle, CPU fp32.

The oracle is HF transformers' Qwen3ForCausalLM (tiny, random) whose attention is replaced, through
``AttentionInterface``, by eager attention with the per-head mask of docs/head_wise_swa.md: the
last ``n_swa`` KV heads (and the query heads grouped on them) see key j from query p iff j <= p and
(j < S or j > p - W). It recomputes the whole sequence for each greedy token (no HF cache), one prompt
at a time, so positions are plain 0..L-1. Our engine (native and append_attn) runs the same
checkpoint with prefix caching, chunked prefill and a pool small enough to preempt (and, in a
roomy config, batched prefill of whole prompts), recycling on and off, ratios 0, 0.5 and 1, windows
shorter and longer than the prompts. Greedy tokens must be identical.
"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
import torch as real_torch  # noqa: E402
from test_gqa_oracle import _hf_model  # noqa: E402

from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.ops import append_attention as op  # noqa: E402

NEW = 10
SINK = 2
# prompts sharing prefixes (prefix-cache hits at block_size 4); lengths 6..14 so window 5 < prompt < 64
PROMPTS = [[5, 17, 33, 2, 91, 64, 40, 8, 77, 12, 3], [44, 9, 81, 27, 70, 15], [60, 1, 96, 38, 22, 49, 85, 30, 11],
           [5, 17, 33, 2, 91, 64, 40, 8, 77, 7, 55, 19], [60, 1, 96, 38, 22, 49, 85, 30, 11, 4, 88, 23, 9, 2]]
QWEN3 = dict(vocab_size=101, num_hidden_layers=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=0,
             eos_token_id=1, pad_token_id=None, hidden_size=44, intermediate_size=52, num_attention_heads=6,
             num_key_value_heads=2, head_dim=12, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _swa_attention(n_swa: int, window: int, sink: int):
    """Eager GQA attention with the head-wise window (the docs' rule, written independently of ours)."""
    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        b, hq, q_len, d = query.shape
        hkv, k_len = key.shape[1], key.shape[2]
        group = hq // hkv
        k = key.repeat_interleave(group, dim=1)
        v = value.repeat_interleave(group, dim=1)
        scores = real_torch.matmul(query, k.transpose(-1, -2)) * scaling          # [b, hq, q, k]
        p = real_torch.arange(k_len - q_len, k_len).unsqueeze(1)
        j = real_torch.arange(k_len).unsqueeze(0)
        allowed = real_torch.zeros(hq, q_len, k_len, dtype=real_torch.bool)
        for h in range(hq):
            kv_head = h // group
            ok = j <= p
            if kv_head >= hkv - n_swa:
                ok = ok & ((j < sink) | (j > p - window))
            allowed[h] = ok
        scores = scores.masked_fill(~allowed.unsqueeze(0), float("-inf"))
        out = real_torch.matmul(real_torch.softmax(scores.float(), dim=-1).to(v.dtype), v)
        return out.transpose(1, 2).contiguous(), None
    return attend


def _oracle(model, n_swa: int, window: int) -> list[list[int]]:
    name = f"swa_{n_swa}_{window}_{SINK}"
    transformers.AttentionInterface.register(name, _swa_attention(n_swa, window, SINK))
    model.config._attn_implementation = name
    for layer in model.model.layers:
        layer.self_attn.config._attn_implementation = name
    result = []
    with real_torch.no_grad():
        for prompt in PROMPTS:
            ids = list(prompt)
            for _ in range(NEW):
                logits = model(input_ids=real_torch.tensor([ids]), use_cache=False).logits[0, -1]
                ids.append(int(logits.argmax()))
            result.append(ids[len(prompt):])
    return result


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = _hf_model("Qwen3", QWEN3, seed=3)
    path = tmp_path_factory.mktemp("qwen3_swa")
    model.save_pretrained(path)
    return model, path


_EXPECTED: dict = {}


def _expected(model, n_swa: int, window: int):
    key = (n_swa, window if n_swa else 0)
    if key not in _EXPECTED:
        _EXPECTED[key] = _oracle(model, n_swa, window)
    return _EXPECTED[key]


def _engine(path, backend: str, ratio: float, window: int, recycle: bool, tight: bool, device: str = "cpu",
            cuda_graph: bool = False, swa_mode: str = "skip", num_blocks: int | None = None) -> LLM:
    attention = {"backend": backend, "head_wise_swa_ratio": ratio}
    if ratio:
        attention.update(sliding_window=window, sink_tokens=SINK, swa_mode=swa_mode)
    cache = {"block_size": 4, "enable_prefix_caching": True, "swa_recycle": recycle}
    if tight:   # chunks of <= 8 tokens, 3 at once, 10 blocks per head: prefix hits and preemption
        cache["num_blocks"] = 10
        sched = {"max_num_seqs": 3, "max_num_batched_tokens": 8, "enable_chunked_prefill": True}
    else:       # whole prompts prefilled together
        cache["num_blocks"] = 64
        sched = {"max_num_seqs": 8, "max_num_batched_tokens": 128, "enable_chunked_prefill": False}
    if num_blocks is not None:
        cache["num_blocks"] = num_blocks
    return LLM(config_from_dict({"model": str(path), "device": device, "dtype": "float32", "attention": attention,
                                 "cache": cache, "scheduler": sched, "cuda_graph": cuda_graph}))


def engine_tokens(llm: LLM) -> list[list[int]]:
    reqs = [GenerationRequest(id=i, prompt_token_ids=p, params=SamplingParams(max_tokens=NEW, ignore_eos=True))
            for i, p in enumerate(PROMPTS)]
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    return [list(o.token_ids) for o in outs]


# (ratio, window, recycle): ratio 0 is today's engine; windows 5 (< every prompt) and 64 (> all)
CASES = [(0.0, 0, False), (0.5, 5, False), (0.5, 5, True), (0.5, 64, True), (1.0, 5, True), (1.0, 6, False),
         (1.0, 64, False)]
BATCHED = [(0.0, 0, False), (0.5, 5, True), (1.0, 6, False)]    # the roomy config: a few cases (fast CI)
PARAMS = ([pytest.param(*c, True, id=f"{c[0]}-W{c[1]}-recycle{int(c[2])}-chunked_prefix_preempt") for c in CASES]
          + [pytest.param(*c, False, id=f"{c[0]}-W{c[1]}-recycle{int(c[2])}-batched_prefill") for c in BATCHED])


@pytest.mark.parametrize("backend", ["native", "append_attn"])
@pytest.mark.parametrize("ratio,window,recycle,tight", PARAMS)
def test_engine_matches_hf_swa_oracle(checkpoint, backend, ratio, window, recycle, tight):
    if backend == "append_attn" and op.implementation() != "custom_op":
        pytest.skip("custom ops not built")
    model, path = checkpoint
    n_swa = int(ratio * QWEN3["num_key_value_heads"])
    expected = _expected(model, n_swa, window)
    llm = _engine(path, backend, ratio, window, recycle, tight)
    assert (llm.runner.head_wise_swa is None) == (ratio == 0)
    for r, tokens in enumerate(engine_tokens(llm)):
        assert tokens == expected[r], f"prompt {r}"
    st = llm.stats()
    if tight:
        # ratio 1 with recycling and a short window: every head holds O(S + W) blocks, so all fit
        fits_by_recycling = ratio == 1 and recycle and window < 64
        assert (st.num_preemptions > 0) != fits_by_recycling, "the small pool must force preemption (only then)"
        assert st.cached_prompt_tokens > 0, "the shared prefixes must hit the prefix cache"


def test_window_changes_tokens(checkpoint):
    """The oracle's window matters on this model (else the cases above would prove little)."""
    model, _ = checkpoint
    assert _expected(model, 2, 5) != _expected(model, 0, 0)
    assert _expected(model, 1, 5) != _expected(model, 0, 0)


@pytest.mark.parametrize("backend", ["native", "append_attn"])
def test_per_head_ranges_match_hf_swa_oracle(checkpoint, backend):
    """Recycling at ratio 0.5 re-splits the budget (16 blocks x 2 heads): the SWA head's range is
    what 3 recycled rows and one chunk can use (14), the full head gets the rest (18), both in one
    flat cache per layer with global ids in the tables. Tokens equal the oracle's, through chunked
    prefill and prefix hits."""
    if backend == "append_attn" and op.implementation() != "custom_op":
        pytest.skip("custom ops not built")
    model, path = checkpoint
    llm = _engine(path, backend, 0.5, 5, True, tight=True, num_blocks=16)
    assert (llm.runner.swa_num_blocks, llm.runner.limits.num_blocks) == (14, 18)
    assert [p.num_blocks for p in llm.pool.pools] == [18, 14] and llm.pool.bases.tolist() == [0, 18]
    assert tuple(llm.runner.kv_caches[0][0].shape[:2]) == (18 + 14, 4)
    for r, tokens in enumerate(engine_tokens(llm)):
        assert tokens == _expected(model, 1, 5)[r], f"prompt {r}"
    assert llm.stats().cached_prompt_tokens > 0


def _peak_rows(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], int]:
    """Greedy tokens, and the most rows decoding together in one step."""
    peak, schedule = [0], llm.scheduler.schedule

    def counting():
        out = schedule()
        peak[0] = max(peak[0], sum(not s.is_prefill for s in out.scheduled))
        return out
    llm.scheduler.schedule = counting
    outs = llm.generate([GenerationRequest(id=i, prompt_token_ids=p, params=SamplingParams(max_tokens=max_tokens,
                                                                                        ignore_eos=True))
                         for i, p in enumerate(prompts)], use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(prompts)
    return [list(o.token_ids) for o in outs], peak[0]


def test_recycling_fits_more_requests_at_the_same_kv_memory(checkpoint):
    """Ratio 0.5 at one budget (40 blocks x 2 KV heads), 6 requests of 42 + 30 tokens (11 to 18
    blocks): uniform tables (mask mode) decode at most 3 together and preempt over and over;
    recycling with per-head ranges (the SWA head 20 blocks, the full head 60) decodes 4
    (max_num_seqs) together, preempts less and takes fewer steps, with the same tokens."""
    _, path = checkpoint
    prompts = [[(7 * i + 3 * j) % 97 + 2 for j in range(42)] for i in range(6)]

    def llm(mode: str, recycle: bool) -> LLM:
        return LLM(config_from_dict({
            "model": str(path), "device": "cpu", "dtype": "float32",
            "attention": {"backend": "native", "head_wise_swa_ratio": 0.5, "sliding_window": 5, "sink_tokens": SINK,
                          "swa_mode": mode},
            "cache": {"block_size": 4, "num_blocks": 40, "swa_recycle": recycle},
            "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 16, "enable_chunked_prefill": True}}))
    uniform_llm, recycled_llm = llm("mask", False), llm("skip", True)
    assert (recycled_llm.runner.limits.num_blocks, recycled_llm.runner.swa_num_blocks) == (60, 20)
    uniform, uniform_peak = _peak_rows(uniform_llm, prompts, 30)
    recycled, recycled_peak = _peak_rows(recycled_llm, prompts, 30)
    assert recycled == uniform
    u, r = uniform_llm.stats(), recycled_llm.stats()
    assert (uniform_peak, recycled_peak) == (3, 4), (uniform_peak, recycled_peak)
    assert r.num_preemptions < u.num_preemptions and r.steps < u.steps, (u, r)
