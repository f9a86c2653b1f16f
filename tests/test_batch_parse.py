"""Line validation of `paddle-mla generate` (no engine: a byte tokenizer stands in)."""

import json

import pytest
from fake_llm import ByteTokenizer

from paddle_mla.batch_parse import Context, LineError, build_request, derive_seed, split_line
from paddle_mla.engine.request import GenerationRequest, SamplingParams


def ctx(**kw):
    base = {"tokenizer": ByteTokenizer(), "max_model_len": 32, "default_params": SamplingParams(max_tokens=8),
            "request_cls": GenerationRequest, "base_seed": 0}
    base.update(kw)
    return Context(**base)


def build(obj, line_no=1, **kw):
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return build_request(split_line(raw), line_no, ctx(**kw))


def error_of(obj, **kw):
    with pytest.raises(LineError) as info:
        build(obj, **kw)
    return info.value


def test_plain_prompt_uses_config_defaults_and_derived_seed():
    req = build({"id": "a", "prompt": "hey"}, line_no=7)
    assert req.id == 7 and req.prompt == "hey" and req.prompt_token_ids == ByteTokenizer().encode("hey")
    assert req.params.max_tokens == 8 and req.params.temperature == 0.0
    assert req.params.seed == derive_seed(0, 7) != derive_seed(0, 8)
    assert build({"prompt": "hey", "seed": 3}).params.seed == 3


def test_max_tokens_capped_at_max_model_len_like_vllm():
    req = build({"prompt": "x" * 30, "max_tokens": 100, "min_tokens": 50})
    assert req.params.max_tokens == 2 and req.params.min_tokens == 2
    err = error_of({"prompt": "x" * 32})
    assert err.kind == "prompt_too_long" and "at most 31" in err.message


def test_openai_batch_line_ignores_model_and_checks_body_fields():
    parsed = split_line(json.dumps({"custom_id": "r1", "method": "POST", "url": "/v1/completions",
                                    "body": {"model": "m", "prompt": "a", "stop": "\n"}}).encode())
    assert parsed.id_field == "custom_id" and parsed.id == "r1"
    req = build_request(parsed, 1, ctx())
    assert req.params.stop == ["\n"]
    err = error_of({"custom_id": "r2", "body": {"prompt": "a", "id": 3}})
    assert err.kind == "unknown_field" and "'id'" in err.message


def test_unknown_field_names_closest_valid_one():
    assert "did you mean 'temperature'" in error_of({"prompt": "a", "temprature": 1}).message
    assert "valid fields" in error_of({"prompt": "a", "zzzzzz": 1}).message


def test_messages_without_chat_template_and_with_one():
    msgs = [{"role": "user", "content": "hi"}]
    assert error_of({"messages": msgs}).kind == "no_chat_template"
    req = build({"messages": msgs}, tokenizer=ByteTokenizer(chat_template=True))
    assert req.prompt_token_ids == ByteTokenizer().encode("<user>hi\n<assistant>")


@pytest.mark.parametrize("obj,kind", [
    ({"prompt": "a", "top_p": 0.0}, "invalid_sampling"),
    ({"prompt": "a", "max_tokens": 2.0}, "invalid_request"),
    ({"prompt": "a", "max_tokens": False}, "invalid_request"),
    ({"prompt_token_ids": [3, 300]}, "token_out_of_range"),
    ({"prompt_token_ids": [3, 299]}, None),
])
def test_types_and_ranges(obj, kind):
    if kind is None:
        build(obj)
    else:
        assert error_of(obj).kind == kind


def test_tokenizer_failure_is_a_line_error_not_a_crash():
    class Broken(ByteTokenizer):
        def encode(self, text):
            raise RuntimeError("boom")

    from paddle_mla.batch_run import BatchSummary, _items

    items = list(_items([(1, b'{"id": 1, "prompt": "x"}')], ctx(tokenizer=Broken()), set(), BatchSummary()))
    assert items[0].error == ("invalid_request", "RuntimeError: boom")
