"""Head-wise SWA configuration: the keys, their checks, and which heads are SWA heads."""

from __future__ import annotations

import pytest

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.cache.head_pool import HeadWisePool, make_block_pool
from paddle_mla.cache.swa import head_wise_swa
from paddle_mla.config.schema import ConfigError, EngineConfig, config_from_dict, swa_heads

SWA = {"attention": {"backend": "native", "head_wise_swa_ratio": 0.5, "sliding_window": 16, "sink_tokens": 4},
       "cache": {"swa_recycle": True}, "device": "cpu"}


def test_defaults_are_off():
    cfg = EngineConfig()
    a = cfg.attention
    assert (a.head_wise_swa_ratio, a.sliding_window, a.sink_tokens, cfg.cache.swa_recycle) == (0.0, 0, 0, False)
    assert head_wise_swa(cfg, "mla", 0) is None and head_wise_swa(cfg, "gqa", 8) is None
    assert type(make_block_pool(8, 4, False, None)) is BlockPool


def test_keys_load_and_make_the_plan():
    cfg = config_from_dict(SWA)
    spec = head_wise_swa(cfg, "gqa", 8)
    assert (spec.num_kv_heads, spec.num_swa_heads, spec.window, spec.sink, spec.recycle) == (8, 4, 16, 4, True)
    assert [spec.is_swa_head(h) for h in range(8)] == [False] * 4 + [True] * 4   # the last n_swa heads
    assert isinstance(make_block_pool(8, 4, True, spec), HeadWisePool)


@pytest.mark.parametrize("attention, needle", [
    ({"head_wise_swa_ratio": 1.5, "sliding_window": 8},
     "'attention.head_wise_swa_ratio' is 1.5; allowed: a number in [0, 1]"),
    ({"head_wise_swa_ratio": -0.1, "sliding_window": 8}, "'attention.head_wise_swa_ratio' is -0.1"),
    ({"head_wise_swa_ratio": float("nan"), "sliding_window": 8}, "'attention.head_wise_swa_ratio' is nan"),
    ({"head_wise_swa_ratio": 0.5}, "'attention.sliding_window' is not set"),
    ({"sliding_window": -3}, "'attention.sliding_window' is -3"),
    ({"sink_tokens": -1}, "'attention.sink_tokens' is -1"),
    ({"head_wise_swa_ratio": "half"}, "'attention.head_wise_swa_ratio' is 'half'; allowed: a number"),
])
def test_bad_values_are_named(attention, needle):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"attention": attention})
    assert needle in str(err.value)


def test_swa_recycle_must_be_a_bool():
    with pytest.raises(ConfigError, match="'cache.swa_recycle' is 'yes'"):
        config_from_dict({"cache": {"swa_recycle": "yes"}})


def test_swa_heads_must_be_a_whole_number():
    assert swa_heads(0.5, 8) == 4 and swa_heads(1.0, 3) == 3 and swa_heads(0.0, 5) == 0
    assert swa_heads(1 / 3, 3) == 1 and swa_heads(0.3, 10) == 3      # float rounding is not an error
    with pytest.raises(ConfigError) as err:
        swa_heads(0.3, 8)
    msg = str(err.value)
    assert "0.3" in msg and "num_key_value_heads 8" in msg and "2.4" in msg and "1/8" in msg


@pytest.mark.parametrize("backend", ["triton_mla", "dsa"])
def test_only_gqa_backends_take_a_ratio(backend):
    with pytest.raises(ConfigError) as err:
        config_from_dict({**SWA, "attention": {**SWA["attention"], "backend": backend}})
    assert f"'attention.head_wise_swa_ratio' > 0 is not supported by '{backend}'" in str(err.value)
    assert "use native" in str(err.value)


def test_mla_models_refuse_a_ratio():
    cfg = config_from_dict(SWA)
    with pytest.raises(ConfigError, match="needs a GQA model .* this checkpoint is 'mla'"):
        head_wise_swa(cfg, "mla", 4)
    with pytest.raises(ConfigError, match="not a whole number"):
        head_wise_swa(config_from_dict({**SWA, "attention": {**SWA["attention"], "head_wise_swa_ratio": 0.4}}),
                      "gqa", 4)


def test_engine_on_an_mla_checkpoint_refuses_a_ratio():
    from paddle_mla.engine.llm import LLM

    with pytest.raises(ConfigError, match="needs a GQA model"):
        LLM(config_from_dict({**SWA, "model": "tiny", "dtype": "float32"}))


def test_swa_mode_mask_keeps_uniform_tables():
    """attention.swa_mode: mask is the seed's baseline: one uniform pool, the op told to mask."""
    cfg = config_from_dict({**SWA, "attention": {**SWA["attention"], "swa_mode": "mask"}, "cache": {}})
    spec = head_wise_swa(cfg, "gqa", 8)
    assert spec.mask and not spec.head_wise_tables and spec.backend_kwargs()["swa_mask"] is True
    assert type(make_block_pool(8, 4, True, spec)) is BlockPool
    assert head_wise_swa(config_from_dict(SWA), "gqa", 8).backend_kwargs()["swa_mask"] is False


@pytest.mark.parametrize("extra, needle", [
    ({"attention": {"swa_mode": "walk"}}, "'attention.swa_mode' is 'walk'"),
    ({"attention": {"swa_mode": "mask"}, "cache": {"swa_recycle": True}},
     "'cache.swa_recycle' is true with 'attention.swa_mode: mask'"),
])
def test_swa_mode_checks(extra, needle):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"attention": {**SWA["attention"], **extra["attention"]}, "cache": extra.get("cache", {})})
    assert needle in str(err.value)
