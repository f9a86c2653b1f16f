"""``cache.dtype: fp8_e4m3`` in the engine (tiny model, CPU, fp32 compute): the cache really is FP8 and
holds more blocks in the same budget; every path reads the same rounded keys, so prefix caching,
chunked prefill and preemption each on and off give the same tokens; triton_mla (interpreter) gives
native's tokens; the configs it cannot serve are refused with a line that says why."""

from __future__ import annotations

import pytest
from test_engine_equivalence import BLOCK, VARIANTS, check_variant, make_llm, workload

from paddle_mla.config.schema import ConfigError

FP8 = {"dtype": "fp8_e4m3"}


def _fp8_llm(**over):
    cache = {**FP8, **over.pop("cache", {})}
    return make_llm(cache=cache, **over)


@pytest.fixture(scope="module")
def fp8_engine():
    return _fp8_llm()


@pytest.fixture(scope="module")
def fp8_baseline(fp8_engine):
    reqs = workload(fp8_engine.runner.arch.vocab_size)
    return reqs, [o.token_ids for o in fp8_engine.generate(reqs, use_tqdm=False)]


def test_cache_is_fp8_rows_with_scale_slot(fp8_engine):
    from paddle_mla.cache.fp8_latent import row_width, storage_dtype

    llm = fp8_engine
    arch = llm.runner.arch
    caches = llm.runner.kv_caches
    assert len(caches) == arch.num_layers
    width = row_width(arch.mla.latent_dim)
    assert width % 16 == 0 and arch.mla.latent_dim + 4 <= width < arch.mla.latent_dim + 20
    assert all(c.dtype == storage_dtype() and c.shape[-1] == width for c in caches)
    assert llm.runner.plan.kv.fp8 and llm.runner.plan.kv.width == width


def test_auto_sized_cache_holds_more_blocks(monkeypatch):
    """Under the CPU's fixed budget the block count follows the bytes a token takes: 4 x latent in
    fp32 against the FP8 row's bytes."""
    from paddle_mla.cache import kv_cache

    budget = 1 << 18     # below what the engine could use, so the budget decides
    monkeypatch.setattr(kv_cache, "CPU_AUTO_CACHE_BYTES", budget)
    runners = {dtype: make_llm(cache={"num_blocks": "auto", "dtype": dtype}).runner for dtype in ("auto", "fp8_e4m3")}
    blocks = {dtype: r.limits.num_blocks for dtype, r in runners.items()}
    arch = runners["auto"].arch
    from paddle_mla.cache.fp8_latent import row_width

    per_token = {"auto": 4 * arch.mla.latent_dim, "fp8_e4m3": row_width(arch.mla.latent_dim)}
    for dtype, n in blocks.items():
        assert n == budget // (arch.num_layers * BLOCK * per_token[dtype])
    assert blocks["fp8_e4m3"] > 2 * blocks["auto"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_features_do_not_change_fp8_tokens(fp8_baseline, variant):
    check_variant(_fp8_llm(**VARIANTS[variant]), variant, *fp8_baseline)


def test_fp8_cache_rounds_the_keys_and_no_more():
    """Against the fp32 cache the first token is the same and its logprob moves (the keys are rounded)
    by a few hundredths on this random model (0.002-0.08 measured): e4m3's rounding, not a misplaced
    scale or row, which would move it by the logit's whole size."""
    plain = make_llm()
    reqs = workload(plain.runner.arch.vocab_size, n=4)
    for r in reqs:
        r.params.logprobs = True
        r.params.max_tokens = 1
    ref = plain.generate(reqs, use_tqdm=False)
    got = _fp8_llm().generate(reqs, use_tqdm=False)
    moved = []
    for a, b in zip(ref, got):
        assert a.token_ids == b.token_ids
        moved.append(abs(a.outputs[0].logprobs[0].logprob - b.outputs[0].logprobs[0].logprob))
    assert 0.0 < max(moved) < 0.25, moved


@pytest.mark.triton
def test_triton_mla_matches_native_on_fp8_cache(fp8_baseline):
    reqs, expected = fp8_baseline
    reqs, expected = reqs[:3], expected[:3]
    # deterministic: prompt rows run expanded over key segments (the gather's piece form)
    for over in ({}, VARIANTS["all"], {"deterministic": True, **VARIANTS["chunked"]}):
        llm = _fp8_llm(attention={"backend": "triton_mla"}, **over)
        assert [o.token_ids for o in llm.generate(reqs, use_tqdm=False)] == expected


def test_unsupported_configs_are_refused():
    with pytest.raises(ConfigError, match="cache.dtype: fp8_e4m3.*not supported by attention.backend 'append_attn'"):
        make_llm(cache=FP8, attention={"backend": "append_attn"})
    from paddle_mla.config.backends import check_model_backend

    assert "is GQA" in check_model_backend("qwen3", "native", "fp8_e4m3")
    assert "dsa" in check_model_backend("deepseek_v32", "native", "fp8_e4m3")
    assert check_model_backend("deepseek_v3", "triton_mla", "fp8_e4m3") is None
    # a backend without FP8 rows is refused once, by its capability, not again by the model rule
    from paddle_mla.config.backends import resolved_config
    from paddle_mla.config.schema import config_from_dict

    for model_type in ("deepseek_v32", "qwen3"):
        with pytest.raises(ConfigError) as err:
            resolved_config(config_from_dict({"model": "tiny", "cache": FP8}), "gpu", model_type)
        assert len(err.value.errors) == 1 and "cache.dtype: fp8_e4m3" in err.value.errors[0], err.value.errors
    with pytest.raises(ConfigError, match="'cache.dtype' is 'fp16'"):
        make_llm(cache={"dtype": "fp16"})
