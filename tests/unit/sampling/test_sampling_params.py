"""SamplingParams.validate: the OpenAI / vLLM ranges of the sampling fields."""

from __future__ import annotations

import pytest

from paddle_mla.sched.request import MAX_N, MAX_TOP_LOGPROBS, SamplingParams

GOOD = [
    {}, {"n": 1}, {"n": MAX_N}, {"presence_penalty": -2.0}, {"presence_penalty": 2}, {"frequency_penalty": 1.5},
    {"repetition_penalty": 0.5}, {"repetition_penalty": 3}, {"logprobs": True},
    {"logprobs": True, "top_logprobs": MAX_TOP_LOGPROBS}, {"logprobs": True, "top_logprobs": 0},
    {"min_tokens": 4, "max_tokens": 4},
]

BAD = [
    ({"n": 0}, "n must"), ({"n": MAX_N + 1}, "n must"), ({"n": 2.0}, "n must"), ({"n": True}, "n must"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"presence_penalty": "1"}, "presence_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"), ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"logprobs": 1}, "logprobs must"), ({"logprobs": True, "top_logprobs": MAX_TOP_LOGPROBS + 1}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"), ({"top_logprobs": 3}, "needs logprobs"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"),
]


@pytest.mark.parametrize("fields", GOOD)
def test_valid(fields):
    SamplingParams(**fields).validate()


@pytest.mark.parametrize("fields,message", BAD)
def test_invalid(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields).validate()
