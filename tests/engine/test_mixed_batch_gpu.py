"""Split mixed batches on the GPU (triton_mla), long contexts; run by scripts/gpu_check.sh.

- backend level: decodes at up to 6k context + extend rows over cached prefixes of up to 4k, in
  extend chunks of 1024 rows (and in one chunk), vs native and the plain references; fp32 with
  exact fp32 dots (the triton_mla kernels pick input_precision "ieee" for fp32 operands themselves,
  so this holds under a plain ``pytest -m gpu`` whatever TRITON_F32_DEFAULT says) and bf16.
  In fp32 every implementation is held to the float64 answer: its error may be at most twice that
  of the plain fp32 reference. With outputs of magnitude ~30 over 6k-key softmaxes, plain fp32
  itself is off by ~2.5e-4 (H100, 2026-11-22: triton 2.8e-4, native 2.0e-4, plain fp32 2.4e-4),
  so a fixed 1e-4 between two fp32 runs tested rounding order, not correctness;
- short extend rows (64 new tokens over 8k cached) run absorbed as pseudo decode rows, next to
  decodes and a long expanded chunk, vs native and the plain reference;
- the attention of a mixed step (prepare + forward) makes no host sync;
- engine level: the tiny model in fp32 with chunked prefill + prefix caching + CUDA graphs gives
  the same greedy tokens as native with all of them off, on prompts sharing a 900-token prefix
  (step budget and extend chunk 96 tokens).
"""

from __future__ import annotations

import os
import random

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

import pytest  # noqa: E402
from helpers.mixed_batch_cases import make_case, plain_reference, run_backend  # noqa: E402

from paddle_mla.platform import runtime  # noqa: E402
from paddle_mla.attention.backend import MLADims, create_backend  # noqa: E402
from paddle_mla.attention.forward_meta import ForwardMeta  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.triton]

# DeepSeek-V3 per-head dims, 16 heads
DIMS = MLADims(num_heads=16, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
               softmax_scale=192 ** -0.5)
LONG = [(6000, 1), (1, 1), (4095, 1), (3000, 512), (1, 1), (0, 700), (2500, 3), (4096, 64)]


def _dev() -> str:
    return runtime.device_string("gpu")


def _assert_fp32_as_exact_as_plain(got, native, case, cache, meta) -> None:
    """``got`` and ``native`` are within 2x the plain fp32 reference's error of the float64 answer."""
    exact = plain_reference(case, cache, meta, dims=DIMS, compute_dtype=torch.float64)
    plain = plain_reference(case, cache, meta, dims=DIMS)
    bound = 2 * float((plain.double() - exact).abs().max())
    assert 0 < bound < 1e-4 * float(exact.abs().max())   # the plain reference's own error is fp32-sized
    for name, x in (("triton_mla", got), ("native", native)):
        err = float((x.double() - exact).abs().max())
        assert err <= bound, f"{name}: max |err| vs float64 {err:.3e} > 2 x plain fp32's ({bound / 2:.3e})"


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("dtype,chunk", [("float32", 1024), ("bfloat16", 1024), ("bfloat16", 0)])
def test_long_context_mixed_batch(dtype, chunk):
    case = make_case(LONG, page=64, device=_dev(), dtype=getattr(torch, dtype), seed=chunk, dims=DIMS)
    got, cache, meta = run_backend("triton_mla", case, _dev(), dims=DIMS, extend_chunk_tokens=chunk)
    native, native_cache, _ = run_backend("native", case, _dev(), dims=DIMS)
    assert meta.num_decode_reqs == 3 and torch.equal(cache, native_cache)
    assert not torch.isnan(got).any()
    if dtype == "float32":
        _assert_fp32_as_exact_as_plain(got, native, case, cache, meta)
    else:   # bf16 inputs and K/V; the references attend in fp32
        plain = plain_reference(case, cache, meta, dims=DIMS)
        assert _rel(got, native) < 2e-2 and _rel(got, plain) < 2e-2


# decodes, short extends over an 8k cached prefix (absorbed), a long chunk (expanded), short tail
SHORT_LONG = [(8192, 1), (300, 1), (8192, 64), (8192, 64), (4096, 1024), (8192, 64), (6000, 17)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_short_extends_absorbed_long_context(dtype):
    case = make_case(SHORT_LONG, page=64, device=_dev(), dtype=getattr(torch, dtype), seed=5, dims=DIMS)
    got, cache, meta = run_backend("triton_mla", case, _dev(), dims=DIMS, extend_chunk_tokens=2048)
    native, _, _ = run_backend("native", case, _dev(), dims=DIMS)
    split = meta.attn.short_split
    assert (split.lead_begin, split.lead_end, split.tail_begin, split.rows) == (2, 4, 5, 64 * 3 + 17)
    assert not torch.isnan(got).any()
    if dtype == "float32":
        _assert_fp32_as_exact_as_plain(got, native, case, cache, meta)
    else:
        plain = plain_reference(case, cache, meta, dims=DIMS)
        assert _rel(got, native) < 2e-2 and _rel(got, plain) < 2e-2


def test_mixed_step_attention_makes_no_host_sync():
    case = make_case(LONG, page=64, device=_dev(), dtype=torch.bfloat16, seed=3, dims=DIMS)
    be = create_backend("triton_mla", dims=DIMS, max_num_seqs=len(LONG), max_model_len=8192, block_size=64,
                        device=_dev(), dtype=torch.bfloat16, max_num_batched_tokens=2048, extend_chunk_tokens=1024)
    meta = ForwardMeta.build(case.batch, 64, _dev())
    for checked in (False, True):   # the checked run has every kernel compiled
        runtime.synchronize()
        torch.cuda.set_sync_debug_mode("error" if checked else "default")
        try:
            be.prepare(meta)
            be.forward(case.q_nope, case.q_pe, case.latent, case.w_kc, case.w_vc, case.cache, meta)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    runtime.synchronize()


def _llm(backend: str, features: bool) -> LLM:
    return LLM(config_from_dict({
        "device": "gpu", "dtype": "float32", "cuda_graph": features, "attention": {"backend": backend},
        "max_model_len": 2048,
        "cache": {"block_size": 16, "num_blocks": 1024, "enable_prefix_caching": features},
        "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 96 if features else 2048,
                      "enable_chunked_prefill": features}}))


def test_engine_long_context_chunked_prefix_graphs_match_native(monkeypatch):
    from paddle_mla.attention.triton_mla import extend

    monkeypatch.setattr(extend, "CHUNK_TOKENS_MIN", 96)   # extend chunks of the step budget
    base = _llm("native", False)
    vocab = base.runner.arch.vocab_size
    rng = random.Random(11)
    shared = [rng.randrange(3, vocab) for _ in range(900)]
    reqs = [GenerationRequest(id=i, prompt_token_ids=shared + [rng.randrange(3, vocab) for _ in range(7 + 61 * i)],
                              params=SamplingParams(max_tokens=24, ignore_eos=True)) for i in range(6)]
    expected = [o.token_ids for o in base.generate(reqs, use_tqdm=False)]
    del base
    llm = _llm("triton_mla", True)
    assert llm.runner.graphs is not None
    steps = []
    prepare = llm.runner.backend.prepare

    def recording(meta):
        prepare(meta)
        nd = meta.num_decode_reqs
        if meta.num_reqs > nd:   # extend rows: expanded, or absorbed if short
            steps.append((nd, int(meta.num_cached[nd:].max())))

    llm.runner.backend.prepare = recording
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [o.token_ids for o in outs] == expected
    assert llm.stats().cached_prompt_tokens >= 4 * 896
    assert any(nd > 0 and cached > 4 * 96 for nd, cached in steps), "no mixed step over a long cached prefix"
