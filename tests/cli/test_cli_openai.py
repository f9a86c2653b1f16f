"""OpenAI batch output and the sampling fields as the CLI writes them:
logprobs in OpenAI's completion and chat shapes, n choices, penalties; resume over these records.
Shapes are checked under the fake engine (fixed values) and the real one (tiny model)."""

import json
import math

import pytest
from helpers.cli_harness import REAL_ENGINE, invoke, read_jsonl, skip_unless_engine

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSGS = [{"role": "user", "content": "Hi there"}]


def _batch(custom_id, url, **body):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _run(tmp_path, lines, engine="real", monkeypatch=None, extra=(), expect=0, **fake_kw):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    if engine == "fake":
        fake_kw.setdefault("chat_template", True)
    res = invoke(["generate", "-i", str(inp), "-o", str(out), "--overwrite", "--no-progress", *extra], engine,
                 monkeypatch, **fake_kw)
    assert res.exit_code == expect, res.stderr
    return read_jsonl(out)


def _check_envelope(rec, custom_id):
    assert set(rec) == {"id", "custom_id", "response", "error"}, rec
    assert rec["id"].startswith("batch_req_") and rec["custom_id"] == custom_id and rec["error"] is None
    resp = rec["response"]
    assert set(resp) == {"status_code", "request_id", "body"} and resp["status_code"] == 200
    body = resp["body"]
    assert {"id", "object", "created", "model", "choices", "usage"} <= set(body)
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    return body


def _check_completion_logprobs(lp, n_tokens, k):
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n_tokens
    assert all(isinstance(t, str) for t in lp["tokens"]) and all(v <= 0 for v in lp["token_logprobs"])
    assert all(len(top) <= k and all(v <= 0 for v in top.values()) for top in lp["top_logprobs"])
    offsets = lp["text_offset"]
    assert offsets[0] == 0 and all(offsets[i + 1] == offsets[i] + len(lp["tokens"][i]) for i in range(n_tokens - 1))


def _check_chat_logprobs(lp, n_tokens, k, plain=False):
    assert set(lp) == {"content"} and len(lp["content"]) == n_tokens
    for entry in lp["content"]:
        keys = {"token", "logprob", "bytes", "top_logprobs"} | ({"token_id"} if plain else set())
        assert set(entry) == keys, entry
        assert entry["bytes"] == list(entry["token"].encode("utf-8")) and entry["logprob"] <= 0
        assert len(entry["top_logprobs"]) == k
        assert all(set(t) == {"token", "logprob", "bytes"} | ({"token_id"} if plain else set())
                   for t in entry["top_logprobs"])


ENGINES = ["fake", pytest.param("real", marks=pytest.mark.skipif(not REAL_ENGINE, reason="needs the real engine"))]


@pytest.mark.parametrize("engine", ENGINES)
def test_openai_lines_come_back_in_openai_batch_format(engine, tmp_path, monkeypatch):
    recs = _run(tmp_path, [
        _batch("c1", COMPLETIONS, model="my-model", prompt="Hello", max_tokens=3),
        _batch("chat1", CHAT, messages=MSGS, max_tokens=3),
        _batch("bad-url", "/v1/embeddings", input="x"),
        _batch("bad-field", COMPLETIONS, prompt="x", max_tokns=3),
        {"id": "plain", "prompt": "Hello", "max_tokens": 2},
    ], engine, monkeypatch, expect=3)
    c1, chat1, bad_url, bad_field, plain = recs
    body = _check_envelope(c1, "c1")
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == "my-model"
    (choice,) = body["choices"]
    assert set(choice) == {"index", "text", "logprobs", "finish_reason"} and choice["index"] == 0
    assert isinstance(choice["text"], str) and choice["logprobs"] is None and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3
    body = _check_envelope(chat1, "chat1")
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    for rec, cid, needle in ((bad_url, "bad-url", '"/v1/embeddings" is not supported'),
                             (bad_field, "bad-field", "did you mean 'max_tokens'")):
        assert rec["custom_id"] == cid and rec["response"] is None and rec["id"].startswith("batch_req_")
        assert set(rec["error"]) == {"code", "message"} and needle in rec["error"]["message"]
    assert bad_url["error"]["code"] == "invalid_request" and bad_field["error"]["code"] == "unknown_field"
    assert "response" not in plain and plain["id"] == "plain"


@pytest.mark.parametrize("engine", ENGINES)
def test_openai_logprobs_and_n(engine, tmp_path, monkeypatch):
    if engine == "real":
        skip_unless_engine("logprobs")
        skip_unless_engine("n")
    recs = _run(tmp_path, [
        _batch("c", COMPLETIONS, prompt="Hello", max_tokens=4, logprobs=3, n=2, temperature=1.0, ignore_eos=True),
        _batch("chat", CHAT, messages=MSGS, max_tokens=4, logprobs=True, top_logprobs=2, ignore_eos=True),
        _batch("c0", COMPLETIONS, prompt="Hello", max_tokens=2, logprobs=0, ignore_eos=True),
    ], engine, monkeypatch)
    body = _check_envelope(recs[0], "c")
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for c in body["choices"]:
        _check_completion_logprobs(c["logprobs"], 4, 3)
        assert "".join(c["logprobs"]["tokens"]) == c["text"]
    assert body["usage"]["completion_tokens"] == 8
    body = _check_envelope(recs[1], "chat")
    _check_chat_logprobs(body["choices"][0]["logprobs"], 4, 2)
    lp = _check_envelope(recs[2], "c0")["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == 2 and lp["top_logprobs"] == [{}, {}]


@pytest.mark.parametrize("engine", ENGINES)
def test_plain_lines_gain_logprobs_choices_and_warnings(engine, tmp_path, monkeypatch):
    if engine == "real":
        skip_unless_engine("logprobs")
        skip_unless_engine("n")
    recs = _run(tmp_path, [
        {"id": "p", "prompt": "Hello", "max_tokens": 3, "logprobs": 2, "ignore_eos": True},
        {"id": "ids", "prompt_token_ids": [5, 6, 7], "max_tokens": 3, "logprobs": True, "top_logprobs": 1,
         "ignore_eos": True},
        {"id": "m", "messages": MSGS, "max_tokens": 3, "logprobs": True, "top_logprobs": 2, "ignore_eos": True},
        {"id": "n", "prompt": "Hello", "max_tokens": 2, "n": 3, "temperature": 1.0, "seed": 5, "ignore_eos": True},
        {"id": "none", "prompt": "Hello", "max_tokens": 2},
    ], engine, monkeypatch)
    p, ids, m, n, none = recs
    _check_completion_logprobs(p["logprobs"], 3, 2)
    assert "".join(p["logprobs"]["tokens"]) == p["text"]
    _check_completion_logprobs(ids["logprobs"], 3, 1)
    _check_chat_logprobs(m["logprobs"], 3, 2, plain=True)
    assert [e["token_id"] for e in m["logprobs"]["content"]] == m["token_ids"]
    assert [c["index"] for c in n["choices"]] == [0, 1, 2]
    assert n["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in n["choices"]) == 6
    assert (n["text"], n["token_ids"], n["finish_reason"]) == (n["choices"][0]["text"], n["choices"][0]["token_ids"],
                                                               n["choices"][0]["finish_reason"])
    assert all(set(c) == {"index", "text", "token_ids", "finish_reason", "seed"} for c in n["choices"])
    assert "logprobs" not in none and "choices" not in none and "warnings" not in none


@pytest.mark.skipif(not REAL_ENGINE, reason="needs the real engine")
def test_real_engine_logprobs_are_a_distribution(tmp_path):
    """Greedy: the sampled token is the most likely one, so its logprob leads the alternatives."""
    skip_unless_engine("logprobs")
    (rec,) = _run(tmp_path, [{"id": "g", "prompt": "Hello", "max_tokens": 4, "logprobs": 5, "ignore_eos": True}])
    lp = rec["logprobs"]
    for sampled, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        values = list(top.values())
        assert math.isclose(sampled, max(values), rel_tol=1e-5) and sum(math.exp(v) for v in values) <= 1 + 1e-5


@pytest.mark.skipif(not REAL_ENGINE, reason="needs the real engine")
def test_real_engine_accepts_the_penalty_fields(tmp_path):
    lines = [{"id": k, "prompt": "the the the the", "max_tokens": 6, "ignore_eos": True, **f} for k, f in (
        ("base", {}), ("presence", {"presence_penalty": 1.5}), ("frequency", {"frequency_penalty": 1.5}),
        ("repetition", {"repetition_penalty": 1.5}))]
    lines.append(_batch("oa", COMPLETIONS, prompt="the the", max_tokens=2, presence_penalty=0.5,
                        frequency_penalty=0.5, repetition_penalty=1.2))
    recs = _run(tmp_path, lines)
    assert all(r.get("finish_reason") == "length" for r in recs[:4]) and recs[4]["error"] is None


@pytest.mark.parametrize("engine", ENGINES)
def test_resume_keys_openai_records_by_custom_id(engine, tmp_path, monkeypatch):
    lines = [_batch(f"r{i}", COMPLETIONS if i % 2 else CHAT, **({"prompt": f"p{i}"} if i % 2 else {"messages": MSGS}),
                    max_tokens=2) for i in range(6)]
    lines.insert(3, _batch("bad", "/v1/nope", prompt="x"))
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines[:4]))
    out = tmp_path / "out.jsonl"
    kw = {"chat_template": True} if engine == "fake" else {}
    args = ["generate", "-i", str(inp), "-o", str(out), "--no-progress"]
    assert invoke(args, engine, monkeypatch, **kw).exit_code == 3
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = invoke([*args, "--resume", "--summary", str(tmp_path / "s.json")], engine, monkeypatch, **kw)
    assert res.exit_code == 3, res.stderr                  # the error line of the first run still counts
    assert "4 lines already done" in res.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert (s["skipped"], s["requests"], s["errors"], s["errors_before_resume"]) == (4, 3, 0, 1)
    recs = read_jsonl(out)
    assert [r["custom_id"] for r in recs] == [x["custom_id"] for x in lines]
    bodies = [r["response"]["body"]["object"] if r["response"] else None for r in recs]
    assert bodies == ["chat.completion", "text_completion", "chat.completion", None, "text_completion",
                      "chat.completion", "text_completion"]


def test_plain_records_with_choices_and_logprobs_resume(tmp_path, monkeypatch):
    lines = [{"id": i, "prompt": f"p{i}", "max_tokens": 2, "n": 2, "logprobs": 1} for i in range(4)]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines[:2]))
    out = tmp_path / "out.jsonl"
    args = ["generate", "-i", str(inp), "-o", str(out), "--no-progress"]
    assert invoke(args, "fake", monkeypatch).exit_code == 0
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = invoke([*args, "--resume"], "fake", monkeypatch)
    assert res.exit_code == 0 and "2 lines already done" in res.stderr
    assert [r["id"] for r in read_jsonl(out)] == [0, 1, 2, 3]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_cut_max_tokens_says_so(engine, tmp_path, monkeypatch):
    if engine == "real":
        skip_unless_engine("warnings")
    recs = _run(tmp_path, [{"id": "cut", "prompt_token_ids": [5, 6, 7, 8], "max_tokens": 100, "ignore_eos": True},
                           {"id": "fits", "prompt_token_ids": [5, 6], "max_tokens": 3},
                           _batch("oa", COMPLETIONS, prompt_token_ids=[5, 6, 7, 8], max_tokens=100, ignore_eos=True)],
                engine, monkeypatch, extra=("--set", "max_model_len=16", "--summary", str(tmp_path / "s.json")))
    cut, fits, oa = recs
    assert cut["finish_reason"] == "length" and len(cut["token_ids"]) == 12
    assert len(cut["warnings"]) == 1 and "max_tokens" in cut["warnings"][0] and "100" in cut["warnings"][0]
    assert "warnings" not in fits
    assert oa["warnings"] == cut["warnings"]
    assert json.loads((tmp_path / "s.json").read_text())["warnings"] == 2

