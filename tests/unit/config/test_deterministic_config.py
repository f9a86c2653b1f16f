"""``deterministic: true`` is accepted only with a backend whose reductions follow the row alone
(triton_mla, dsa, append_attn); native is refused when the config is read, with the alternatives named."""

import pytest

from paddle_mla.config.backends import check_backend
from paddle_mla.config.schema import ConfigError, config_from_dict


def _cfg(backend: str, deterministic: bool):
    return config_from_dict({"deterministic": deterministic, "device": "gpu", "attention": {"backend": backend}})


@pytest.mark.parametrize("backend", ["triton_mla", "dsa", "append_attn"])
def test_deterministic_accepted_by_batch_invariant_backends(backend):
    assert check_backend(_cfg(backend, True), backend) == []


@pytest.mark.parametrize("backend", ["native"])
def test_deterministic_refused_by_the_others(backend):
    with pytest.raises(ConfigError) as exc:
        _cfg(backend, True)
    (err,) = exc.value.errors
    assert ("'deterministic: true' is not supported" in err
            and all(b in err for b in ("triton_mla", "dsa", "append_attn")))
    assert check_backend(_cfg(backend, False), backend) == []


def test_deterministic_refused_with_tensor_parallelism():
    with pytest.raises(ConfigError) as exc:
        config_from_dict({"deterministic": True, "attention": {"backend": "triton_mla"},
                          "parallel": {"tensor_parallel_size": 2}})
    assert any("all-reduce" in e for e in exc.value.errors)
    config_from_dict({"deterministic": True, "attention": {"backend": "triton_mla"},
                      "parallel": {"data_parallel_size": 2}})
