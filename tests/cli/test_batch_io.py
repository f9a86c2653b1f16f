"""Output writing, resume bookkeeping, ordering and laziness of the generate loop (fake engine)."""

import json
import os

import pytest
from helpers.fake_llm import FakeLLM

from paddle_mla.batch.io import OutputWriteError, OutputWriter, ResumeError, iter_input, prepare_resume, record_key
from paddle_mla.batch.run import run_batch
from paddle_mla.config.schema import EngineConfig
from paddle_mla.sched.request import GenerationRequest


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_lines(path, lines):
    path.write_bytes(b"".join(line.encode() + b"\n" for line in lines))


def test_iter_input_skips_blank_lines_and_counts_physical_lines(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_bytes(b'{"a": 1}\n\n  \r\n{"b": 2}\r\n{"c": 3}')
    with open(p, "rb") as f:
        assert list(iter_input(f)) == [(1, b'{"a": 1}'), (4, b'{"b": 2}'), (5, b'{"c": 3}')]


def test_record_keys():
    assert record_key({"id": "a", "text": ""}) == 'id:"a"'
    assert record_key({"custom_id": 5, "text": ""}) == "id:5"
    assert record_key({"id": None, "line": 3, "text": ""}) == "line:3"
    assert record_key({"id": "a", "error": {"type": "duplicate_id"}, "line": 9}) == "line:9"


def test_prepare_resume_cuts_torn_tail(tmp_path):
    out = tmp_path / "out.jsonl"
    good = [json.dumps({"id": i, "finish_reason": "length"}) for i in range(3)]
    out.write_bytes(("\n".join(good) + "\n").encode() + b'{"id": 3, "fin')
    state = prepare_resume(out)
    assert state.lines == 3 and state.done == {"id:0", "id:1", "id:2"} and state.dropped_bytes == 14
    assert out.read_text().splitlines() == good
    # garbage tail after a crash (complete but unreadable lines): cut as well
    out.write_bytes(out.read_bytes() + b"\x00\x00\x00\n\x00\n")
    assert prepare_resume(out).lines == 3 and out.read_text().splitlines() == good


def test_prepare_resume_refuses_foreign_or_damaged_files(tmp_path):
    out = tmp_path / "out.jsonl"
    write_lines(out, ['{"id": 1, "prompt": "this is an input file"}'])
    with pytest.raises(ResumeError, match="not a paddle-mla generate output"):
        prepare_resume(out)
    write_lines(out, ['{"id": 1, "finish_reason": "stop"}', "garbage", '{"id": 2, "finish_reason": "stop"}'])
    before = out.read_bytes()
    with pytest.raises(ResumeError, match="line 2 is damaged"):
        prepare_resume(out)
    assert out.read_bytes() == before
    assert prepare_resume(tmp_path / "missing.jsonl").lines == 0


def test_writer_appends_and_flushes_each_line(tmp_path):
    out = tmp_path / "o.jsonl"
    w = OutputWriter(out, append=False)
    w.write({"id": 1, "text": "é"})
    assert out.read_text(encoding="utf-8") == '{"id": 1, "text": "é"}\n'   # visible before close
    w.close()
    w = OutputWriter(out, append=True)
    w.write({"id": 2})
    w.close()
    assert [r["id"] for r in records(out)] == [1, 2]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux: a device that is always full)")
def test_a_write_error_names_the_output():
    w = OutputWriter("/dev/full", append=False)
    with pytest.raises(OutputWriteError, match=r"^cannot write the output file /dev/full: .* \(errno 28\)$"):
        w.write({"id": 1})
    w.close()


def _lines(n, bad_every=0):
    for i in range(n):
        if bad_every and i % bad_every == 0:
            yield i + 1, b"{not json"
        else:
            yield i + 1, json.dumps({"id": f"r{i}", "prompt": f"p{i}", "max_tokens": 1 + i % 3}).encode()


def test_order_preserved_and_input_read_lazily(tmp_path):
    llm = FakeLLM(EngineConfig(), lookahead=5)
    consumed = []

    def lines():
        for n, raw in _lines(300, bad_every=7):
            consumed.append(n)
            yield n, raw

    class Probe(OutputWriter):
        def write(self, record):
            # never more than the engine's lookahead (plus the line being parsed) ahead of the output
            assert len(consumed) - self.lines <= 5 + 1
            super().write(record)

    out = tmp_path / "o.jsonl"
    w = Probe(out, append=False)
    summary = run_batch(llm, lines(), w, request_cls=GenerationRequest, progress=False)
    w.close()
    recs = records(out)
    assert len(recs) == 300 and summary.requests == 300 and summary.errors == 43
    for i, rec in enumerate(recs):
        if i % 7 == 0:
            assert rec == {"id": None, "error": rec["error"], "line": i + 1} and rec["error"]["type"] == "invalid_json"
        else:
            assert rec["id"] == f"r{i}" and len(rec["token_ids"]) == 1 + i % 3


def test_engine_errors_become_error_lines(tmp_path):
    llm = FakeLLM(EngineConfig(), fail_over=10)
    out = tmp_path / "o.jsonl"
    w = OutputWriter(out, append=False)
    lines = [(1, b'{"id": 1, "prompt": "short"}'), (2, b'{"id": 2, "prompt": "much longer than ten"}')]
    summary = run_batch(llm, lines, w, request_cls=GenerationRequest, progress=False)
    w.close()
    a, b = records(out)
    assert a["finish_reason"] == "length" and b["error"]["type"] == "engine_error"
    assert "KV blocks" in b["error"]["message"]
    assert summary.errors_by_type == {"engine_error": 1}


def test_resume_skips_done_ids_and_lines(tmp_path):
    llm = FakeLLM(EngineConfig())
    out = tmp_path / "o.jsonl"
    lines = [(1, b'{"id": "a", "prompt": "x"}'), (2, b'{"prompt": "no id"}'), (3, b'{"id": "a", "prompt": "dup"}'),
             (4, b'{"id": "b", "prompt": "y"}')]
    w = OutputWriter(out, append=False)
    run_batch(llm, lines[:3], w, request_cls=GenerationRequest, progress=False)
    w.close()
    state = prepare_resume(out)
    assert state.done == {'id:"a"', "line:2", "line:3"}
    w = OutputWriter(out, append=True)
    s = run_batch(llm, lines, w, request_cls=GenerationRequest, done=state.done, progress=False)
    w.close()
    assert s.skipped == 3 and s.requests == 1
    assert [r.get("id") for r in records(out)] == ["a", None, "a", "b"]


def test_a_line_with_a_repeated_key_keeps_its_id_and_resumes_by_it(tmp_path):
    """A repeated key is an error line that keeps the id the line still names (and always its line
    number); --resume keys it as it keys every other error line, so it is neither lost nor doubled."""
    llm = FakeLLM(EngineConfig())
    out = tmp_path / "o.jsonl"
    lines = [(1, b'{"id": "a", "prompt": "x", "prompt": "y"}'), (2, b'{"id": "b", "id": "c", "prompt": "x"}'),
             (3, b'{"id": "d", "prompt": "ok"}'), (5, b'{"id": "a", "prompt": "again"}')]
    w = OutputWriter(out, append=False)
    run_batch(llm, lines[:2], w, request_cls=GenerationRequest, progress=False)
    w.close()
    first, second = records(out)
    assert first == {"id": "a", "error": {"type": "invalid_json", "message": "key 'prompt' appears twice in one "
                                          "object"}, "line": 1}
    assert second == {"id": None, "error": {"type": "invalid_json", "message": "key 'id' appears twice in one "
                                            "object"}, "line": 2}
    state = prepare_resume(out)
    assert state.done == {'id:"a"', "line:2"}
    w = OutputWriter(out, append=True)
    s = run_batch(llm, lines, w, request_cls=GenerationRequest, done=state.done, progress=False)
    w.close()
    assert s.skipped == 2 and s.requests == 2
    recs = records(out)
    assert [(r.get("id"), r.get("line")) for r in recs] == [("a", 1), (None, 2), ("d", None), ("a", 5)]
    assert recs[2]["finish_reason"] == "length" and recs[3]["error"]["type"] == "duplicate_id"
