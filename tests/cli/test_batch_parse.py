"""Line validation of `paddle-mla generate` (no engine: a byte tokenizer stands in)."""

import json

import pytest
from helpers.fake_llm import ByteTokenizer

from paddle_mla.batch.parse import Context, LineError, build_request, derive_seed, line_format, split_line
from paddle_mla.sched.request import GenerationRequest, SamplingParams


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


def test_max_tokens_is_left_for_the_engine_to_cut_and_report():
    """No silent cap here any more: the engine cuts max_tokens at max_model_len and puts a warning
    on the output (item 9); the prompt length is still checked per line."""
    req = build({"prompt": "x" * 30, "max_tokens": 100, "min_tokens": 50})
    assert req.params.max_tokens == 100 and req.params.min_tokens == 50
    err = error_of({"prompt": "x" * 32})
    assert err.kind == "prompt_too_long" and "at most 31" in err.message


def _openai(body, url="/v1/completions", **extra):
    return {"custom_id": "r", "method": "POST", "url": url, "body": body, **extra}


def test_openai_batch_line_ignores_model_and_checks_body_fields():
    parsed = split_line(json.dumps({"custom_id": "r1", "method": "POST", "url": "/v1/completions",
                                    "body": {"model": "m", "prompt": "a", "stop": "\n"}}).encode())
    assert parsed.id_field == "custom_id" and parsed.id == "r1"
    req = build_request(parsed, 1, ctx())
    assert req.params.stop == ["\n"]
    fmt = line_format(parsed)
    assert fmt.openai and not fmt.chat and fmt.model == "m"
    err = error_of(_openai({"prompt": "a", "id": 3}))
    assert err.kind == "unknown_field" and "'id'" in err.message


@pytest.mark.parametrize("line,needle", [
    (_openai({"prompt": "a"}, url="/v1/embeddings"), '"/v1/embeddings" is not supported'),
    ({"custom_id": "r", "method": "POST", "body": {"prompt": "a"}}, "url null is not supported"),
    (_openai({"prompt": "a"}, method="GET"), "'method' must be"),
    (_openai({"messages": [{"role": "user", "content": "x"}]}), "'messages' go to '/v1/chat/completions'"),
    (_openai({"prompt": "a"}, url="/v1/chat/completions"), "takes 'messages'"),
])
def test_openai_url_and_method_are_checked(line, needle):
    err = error_of(line)
    assert err.kind == "invalid_request" and needle in err.message, err.message


def test_openai_logprob_fields_follow_each_endpoint():
    chat = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    tok = ByteTokenizer(chat_template=True)
    p = build(_openai({"messages": msgs, "logprobs": True, "top_logprobs": 3}, url=chat), tokenizer=tok).params
    assert (p.logprobs, p.top_logprobs) == (True, 3)
    assert "must be true or false" in error_of(_openai({"messages": msgs, "logprobs": 2}, url=chat),
                                               tokenizer=tok).message
    assert "needs 'logprobs': true" in error_of(_openai({"messages": msgs, "top_logprobs": 2}, url=chat),
                                                tokenizer=tok).message
    p = build(_openai({"prompt": "a", "logprobs": 2})).params
    assert (p.logprobs, p.top_logprobs) == (True, 2)
    p = build(_openai({"prompt": "a", "logprobs": 0})).params
    assert (p.logprobs, p.top_logprobs) == (True, 0)
    assert "must be an integer on /v1/completions" in error_of(_openai({"prompt": "a", "logprobs": True})).message
    assert error_of(_openai({"prompt": "a", "logprobs": True, "top_logprobs": 1})).kind == "unknown_field"


@pytest.mark.parametrize("fields,want", [
    ({"logprobs": True}, (True, 0)),
    ({"logprobs": True, "top_logprobs": 4}, (True, 4)),
    ({"logprobs": 5}, (True, 5)),
    ({"logprobs": False}, (False, 0)),
])
def test_plain_logprob_fields(fields, want):
    p = build({"prompt": "a", **fields}).params
    assert (p.logprobs, p.top_logprobs) == want


@pytest.mark.parametrize("fields,kind,needle", [
    ({"logprobs": 21}, "invalid_sampling", "[0, 20]"),
    ({"logprobs": True, "top_logprobs": 21}, "invalid_sampling", "[0, 20]"),
    ({"logprobs": 2, "top_logprobs": 2}, "invalid_request", "not both"),
    ({"top_logprobs": 2}, "invalid_request", "needs 'logprobs': true"),
    ({"logprobs": "yes"}, "invalid_request", "'logprobs' must be"),
    ({"n": 0}, "invalid_sampling", "n must be"),
    ({"n": 1.5}, "invalid_request", "'n' must be an integer"),
    ({"presence_penalty": 3}, "invalid_sampling", "presence_penalty"),
    ({"frequency_penalty": -2.5}, "invalid_sampling", "frequency_penalty"),
    ({"repetition_penalty": 0}, "invalid_sampling", "repetition_penalty"),
])
def test_new_sampling_fields_are_checked(fields, kind, needle):
    err = error_of({"prompt": "a", **fields})
    assert err.kind == kind and needle in err.message, err.message


def test_new_sampling_fields_reach_the_request():
    p = build({"prompt": "a", "n": 3, "presence_penalty": 0.5, "frequency_penalty": -0.5,
               "repetition_penalty": 1.3}).params
    assert (p.n, p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (3, 0.5, -0.5, 1.3)
    p = build(_openai({"prompt": "a", "n": 2, "presence_penalty": 1, "repetition_penalty": 1.1})).params
    assert (p.n, p.presence_penalty, p.repetition_penalty) == (2, 1, 1.1)


def test_without_a_tokenizer_only_token_id_lines_run():
    from paddle_mla.engine.tokenizer import TokenIdsOnly

    tok = TokenIdsOnly("/m", vocab_size=300, eos_token_ids=[2])
    req = build({"prompt_token_ids": [5, 6]}, tokenizer=tok)
    assert req.prompt_token_ids == [5, 6]
    for line, needle in (({"prompt": "a"}, "a text prompt needs a tokenizer"),
                         ({"messages": [{"role": "user", "content": "x"}]}, "'messages' needs a tokenizer"),
                         ({"prompt_token_ids": [5], "stop": ["x"]}, "'stop' strings need a tokenizer")):
        err = error_of(line, tokenizer=tok)
        assert err.kind == "no_tokenizer" and needle in err.message and "tokenizer.json" in err.message
    assert error_of({"prompt_token_ids": [300]}, tokenizer=tok).kind == "token_out_of_range"


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

    from paddle_mla.batch.run import BatchSummary, _items

    items = list(_items([(1, b'{"id": 1, "prompt": "x"}')], ctx(tokenizer=Broken()), set(), BatchSummary()))
    assert items[0].error == ("invalid_request", "RuntimeError: boom")


def test_a_byte_order_mark_does_not_cost_the_line():
    req = build(b'\xef\xbb\xbf{"id": "bom", "prompt": "hi"}')
    assert req.prompt == "hi"


def test_openai_line_needs_its_custom_id():
    err = error_of({"method": "POST", "url": "/v1/completions", "body": {"prompt": "a"}})
    assert err.kind == "invalid_request" and "custom_id" in err.message


def test_openai_chat_max_completion_tokens_stream_and_user():
    """OpenAI's chat spelling of the limit reaches max_tokens; 'user' is metadata; a batch never streams."""
    msgs = [{"role": "user", "content": "hi"}]
    chat = "/v1/chat/completions"
    tok = ByteTokenizer(chat_template=True)
    assert build(_openai({"messages": msgs, "max_completion_tokens": 3, "user": "u", "stream": False},
                         url=chat), tokenizer=tok).params.max_tokens == 3
    assert build(_openai({"prompt": "a", "user": "u", "stream": False})).params.max_tokens == 8
    for body, needle in (({"messages": msgs, "max_completion_tokens": 3, "max_tokens": 4}, "not both"),
                         ({"messages": msgs, "max_completion_tokens": "3"}, "must be an integer"),
                         ({"messages": msgs, "stream": True}, "'stream' must be false")):
        err = error_of(_openai(body, url=chat), tokenizer=tok)
        assert err.kind == "invalid_request" and needle in err.message, (body, err.message)
    # completions has no max_completion_tokens in OpenAI's API
    assert error_of(_openai({"prompt": "a", "max_completion_tokens": 3})).kind == "unknown_field"


def test_a_repeated_key_is_refused_not_read_one_way():
    err = error_of(b'{"id": "d", "prompt": "a", "prompt": "b"}')
    assert err.kind == "invalid_json" and "'prompt' appears twice" in err.message
    err = error_of(b'{"custom_id": "r", "url": "/v1/completions", '
                   b'"body": {"prompt": "a", "max_tokens": 1, "max_tokens": 2}}')
    assert err.kind == "invalid_json" and "'max_tokens'" in err.message


@pytest.mark.parametrize("raw,ident", [
    (b'{"id": "d", "prompt": "a", "prompt": "b"}', "d"),                   # the id itself is given once
    (b'{"id": "d", "id": "d", "prompt": "a"}', "d"),                       # twice, with one value
    (b'{"id": "a", "id": "b", "prompt": "x"}', None),                      # two ids: keyed by line number
    (b'{"custom_id": "r", "url": "/v1/completions", "body": {"prompt": "a", "prompt": "b"}}', "r"),
])
def test_a_repeated_key_keeps_the_id_it_leaves_known(raw, ident):
    parsed = split_line(raw)
    assert parsed.id == ident
    with pytest.raises(LineError) as info:
        build_request(parsed, 1, ctx())
    assert info.value.kind == "invalid_json" and "appears twice in one object" in info.value.message


@pytest.mark.parametrize("raw,message", [
    (b'{"prompt": "ab\\ud800"}', "'prompt' is not valid Unicode: lone surrogate \\ud800 at character 3"),
    (b'{"messages": [{"role": "system", "content": "ok"}, {"role": "user", "content": "\\udfff"}]}',
     "messages[1].content is not valid Unicode: lone surrogate \\udfff at character 1"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "x\\ud83d"}]}]}',
     "messages[0].content[0].text is not valid Unicode: lone surrogate \\ud83d at character 2"),
])
def test_a_lone_surrogate_is_named_not_passed_to_the_tokenizer(raw, message):
    err = error_of(raw, tokenizer=ByteTokenizer(chat_template=True))
    assert (err.kind, err.message) == ("invalid_request", message)
    assert build(b'{"prompt": "\\ud83d\\ude00"}').prompt == "\U0001f600"    # a surrogate pair is one character


def test_chat_content_may_be_a_list_of_text_parts():
    tok = ByteTokenizer(chat_template=True)
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]
    req = build({"messages": [{"role": "user", "content": parts}]}, tokenizer=tok)
    assert req.prompt_token_ids == tok.encode("<user>Hi\nthere\n<assistant>")           # joined by newlines
    req = build(_openai({"messages": [{"role": "user", "content": parts[:1]}]}, url="/v1/chat/completions"),
                tokenizer=tok)
    assert req.prompt_token_ids == tok.encode("<user>Hi\n<assistant>")
    for content, needle in (
            ([parts[0], {"type": "image_url", "image_url": {"url": "http://x/a.png"}}],
             "messages[0].content[1] is a part of type 'image_url'; this engine reads text only"),
            ([{"type": "text", "text": 5}], 'messages[0].content[0] must be {"type": "text", "text": "..."}'),
            (["Hi"], 'messages[0].content[0] must be {"type": "text", "text": "..."}'),
            ([], "messages[0].content is an empty list"),
            ({"type": "text", "text": "Hi"}, "a 'content' string or list of text parts")):
        err = error_of({"messages": [{"role": "user", "content": content}]}, tokenizer=tok)
        assert err.kind == "invalid_request" and needle in err.message, (content, err.message)


def test_an_openai_completions_prompt_list_holds_one_prompt():
    assert build(_openai({"prompt": ["abc"]})).prompt_token_ids == ByteTokenizer().encode("abc")
    assert build(_openai({"prompt": [[5, 6, 7]]})).prompt_token_ids == [5, 6, 7]
    assert build(_openai({"prompt": [5, 6, 7]})).prompt_token_ids == [5, 6, 7]
    for prompt, needle in ((["a", "b"], "'prompt' holds 2 prompts; give one prompt per line"),
                           ([[5], [6], [7]], "'prompt' holds 3 prompts; give one prompt per line"),
                           ([], "'prompt' is an empty list"),
                           ([{"text": "a"}], "'prompt' must be a string, a list of one string, or a list")):
        err = error_of(_openai({"prompt": prompt}))
        assert err.kind == "invalid_request" and needle in err.message, (prompt, err.message)
    assert "give only one of" in error_of(_openai({"prompt": [[5]], "prompt_token_ids": [6]})).message
    assert error_of(_openai({"prompt": [[300]]})).kind == "token_out_of_range"
    # a plain line keeps one spelling per field: token ids go in prompt_token_ids
    assert "token ids go in 'prompt_token_ids'" in error_of({"prompt": ["abc"]}).message
