"""The determinism check (``python -m benchmarks.e2e.determinism``) end to end on CPU: tiny
V2-Lite-structured model, fp32, triton_mla under the interpreter, ``deterministic: true``. Every
configuration (batch 256, chunked prefill with a 16-token budget, prefix caching, DP=2 as two CPU
processes) gives batch 1's tokens and logprob bits on every request, greedy and seeded-sampled."""

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def test_deterministic_mode_matches_batch1_on_every_configuration(tmp_path, monkeypatch):
    from benchmarks.e2e import determinism

    monkeypatch.setattr(determinism.tempfile, "gettempdir", lambda: str(tmp_path))
    res = determinism.main(["--smoke", "--layers", "2", "--requests", "8", "--prompt", "40", "--output", "4",
                            "--chunk", "16", "--modes", "deterministic", "--no-time"])
    rows = res["deterministic"]["rows"]
    assert set(rows) == {"batch256", "chunked", "prefix", "dp2"}
    for name, r in rows.items():
        assert "error" not in r, (name, r)
        assert r["of"] == 8 and r["differ"] == 0 and r["bits_differ"] == 0, (name, r)
    from paddle_mla.ops import batch_invariant

    assert not batch_invariant.enabled(), "a closed deterministic engine left the process switch on"
