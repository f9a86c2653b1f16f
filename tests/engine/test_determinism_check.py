"""The determinism check (``python -m benchmarks.e2e.determinism``) end to end on CPU, fp32,
``deterministic: true``: a tiny V2-Lite-structured model (triton_mla under the interpreter) and a
tiny Qwen3-structured one (append_attn, the C++ op). Every configuration (batch 256, chunked
prefill with a 16-token budget, prefix caching, a pool small enough to preempt, DP=2 as two CPU
processes) gives batch 1's tokens and logprob bits on every request, greedy and seeded-sampled."""

import pytest

pytestmark = [pytest.mark.slow]


def _assert_every_row_matches(res, n):
    rows = res["deterministic"]["rows"]
    assert set(rows) == {"batch256", "chunked", "prefix", "preempt", "dp2"}
    for name, r in rows.items():
        assert "error" not in r, (name, r)
        assert r["of"] == n and r["differ"] == 0 and r["bits_differ"] == 0, (name, r)


@pytest.mark.triton
def test_deterministic_mode_matches_batch1_on_every_configuration(tmp_path, monkeypatch):
    from benchmarks.e2e import determinism

    monkeypatch.setattr(determinism.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")   # what --smoke sets, undone after the test
    # 46-token prompts growing by 3 cross a 16-token block edge, so the preempt pool must preempt
    res = determinism.main(["--smoke", "--layers", "2", "--requests", "8", "--prompt", "46", "--output", "4",
                            "--chunk", "16", "--modes", "deterministic", "--no-time"])
    _assert_every_row_matches(res, 8)
    assert res["deterministic"]["rows"]["preempt"]["preemptions"] > 0
    from paddle_mla.ops import batch_invariant

    assert not batch_invariant.enabled(), "a closed deterministic engine left the process switch on"


@pytest.mark.triton
def test_deterministic_prompts_across_key_segments_match_batch1(tmp_path, monkeypatch):
    """Prompts of 46 tokens over segments of 16 keys, chunked at 12 tokens (chunk edges inside
    segments and query blocks), prefix-cached and preempted: prompt tokens keep their bits through
    the segmented extend in every configuration run in this process (DP=2's processes would not see
    the smaller segment)."""
    from benchmarks.e2e import determinism
    from paddle_mla.attention.triton_mla import extend_segments

    monkeypatch.setattr(determinism.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(extend_segments, "SEGMENT_TOKENS", 16)
    res = determinism.main(["--smoke", "--layers", "2", "--requests", "8", "--prompt", "46", "--output", "4",
                            "--chunk", "12", "--modes", "deterministic", "--no-time",
                            "--variants", "batch1,batch256,chunked,prefix,preempt"])
    rows = res["deterministic"]["rows"]
    assert set(rows) == {"batch256", "chunked", "prefix", "preempt"}
    for name, r in rows.items():
        assert "error" not in r and r["of"] == 8 and r["differ"] == 0 and r["bits_differ"] == 0, (name, r)
    assert rows["preempt"]["preemptions"] > 0


def test_deterministic_gqa_append_attn_matches_batch1_on_every_configuration(tmp_path, monkeypatch):
    from benchmarks.e2e import determinism
    from paddle_mla.ops import append_attention

    if append_attention.implementation(False) != "custom_op":
        pytest.skip("the append_attention op is not built for CPU")
    monkeypatch.setattr(determinism.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")   # what --smoke sets, undone after the test
    # 40-token prompts growing by 12 cross a 16-token block edge, so the preempt pool must preempt
    res = determinism.main(["--smoke", "--dims", "qwen3", "--layers", "2", "--requests", "8", "--prompt", "40",
                            "--output", "12", "--chunk", "16", "--modes", "deterministic", "--no-time"])
    _assert_every_row_matches(res, 8)
    assert res["deterministic"]["rows"]["preempt"]["preemptions"] > 0
