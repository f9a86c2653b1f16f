"""Token-id-only checkpoints: a model folder without tokenizer.json runs the lines
that give prompt_token_ids (text null); lines that need text get a no_tokenizer error line."""

import json
import shutil

import pytest
from helpers.cli_harness import REAL_ENGINE, engine_supports, invoke, read_jsonl

pytestmark = pytest.mark.skipif(not REAL_ENGINE, reason="needs the real engine")


@pytest.fixture(scope="module")
def ids_only_model(tmp_path_factory):
    from paddle_mla.models import ensure_tiny_model

    folder = tmp_path_factory.mktemp("ids_only") / "model"
    shutil.copytree(ensure_tiny_model(), folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").unlink()
    return folder


def test_tokenizer_is_optional_and_vocab_comes_from_config(ids_only_model):
    from paddle_mla.engine.llm import LLM
    from paddle_mla.engine.tokenizer import TokenIdsOnly, load_tokenizer

    tok = load_tokenizer(ids_only_model)
    cfg = json.loads((ids_only_model / "config.json").read_text())
    assert isinstance(tok, TokenIdsOnly) and tok.vocab_size == cfg["vocab_size"] and not tok.has_text
    assert cfg["eos_token_id"] in tok.eos_token_ids
    from paddle_mla.config.schema import load_config

    llm = LLM(load_config(None, (f"model={ids_only_model}",)))
    assert llm.eos_token_ids >= set(tok.eos_token_ids)


def test_generate_without_tokenizer_json(ids_only_model, tmp_path):
    lines = [
        {"id": "ids", "prompt_token_ids": [5, 6, 7], "max_tokens": 3},
        {"id": "text", "prompt": "Hello"},
        {"id": "chat", "messages": [{"role": "user", "content": "Hi"}]},
        {"id": "stop", "prompt_token_ids": [5, 6], "stop": ["x"]},
        {"id": "stop_ids", "prompt_token_ids": [5, 6], "stop_token_ids": [9], "max_tokens": 2},
        {"custom_id": "oa", "method": "POST", "url": "/v1/completions", "body": {"prompt_token_ids": [5, 6],
                                                                                "max_tokens": 2}},
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    res = invoke(["generate", "--model", str(ids_only_model), "-i", str(inp), "-o", str(out), "--no-progress"])
    assert res.exit_code == 3, res.stderr
    ids, text, chat, stop, stop_ids, oa = read_jsonl(out)
    assert ids["text"] is None and len(ids["token_ids"]) == 3 and ids["finish_reason"] == "length"
    for rec, needle in ((text, "a text prompt"), (chat, "'messages'"), (stop, "'stop' strings")):
        assert rec["error"]["type"] == "no_tokenizer", rec
        assert needle in rec["error"]["message"] and "tokenizer.json" in rec["error"]["message"]
    assert stop_ids["text"] is None and stop_ids["finish_reason"] in ("stop", "length")
    assert oa["error"] is None and oa["response"]["body"]["choices"][0]["text"] is None
    assert "model " + str(ids_only_model) in res.stderr.splitlines()[0]


def test_logprobs_without_a_tokenizer_have_null_token_strings(ids_only_model, tmp_path):
    if not engine_supports("logprobs"):
        pytest.skip("the engine does not return logprobs yet (sampler branch)")
    res = invoke(["generate", "--model", str(ids_only_model), "--no-progress"],
                 input=b'{"id": 1, "prompt_token_ids": [5, 6], "max_tokens": 2, "logprobs": 2}\n')
    assert res.exit_code == 0, res.stderr
    lp = json.loads(res.stdout)["logprobs"]
    assert lp["tokens"] == [None, None] and lp["text_offset"] is None and len(lp["token_logprobs"]) == 2
    assert all(k.startswith("token_id:") for top in lp["top_logprobs"] for k in top)
