"""Data-parallel dispatch without replica processes: requests go out balanced by expected tokens, every
request is sent before the parent first waits for an output, each exactly once, outputs come back in
input order; a replica's engine steps while its next batch has not arrived (LLM.stream takes None as
"nothing yet") and blocks only when idle, counting that wait."""

import queue
from collections import deque

import pytest

from paddle_mla.integrations import data_parallel as dp
from paddle_mla.integrations.dp_dispatch import ReplicaLoad, ReplicaRun, pick, request_work
from paddle_mla.integrations.dp_replica import StreamEnd, _Closed, _requests
from paddle_mla.sched.request import (CompletionOutput, EngineStats, GenerationRequest, RequestMetrics, RequestOutput,
                                      SamplingParams)


def _req(i: int, prompt: int, out: int, n: int = 1) -> GenerationRequest:
    return GenerationRequest(i, [5] * prompt, SamplingParams(max_tokens=out, n=n, ignore_eos=True))


def _mixed(count: int) -> list[GenerationRequest]:
    """Long requests at the even positions: alternating by count would give one replica all of them."""
    return [_req(i, 40, 60) if i % 2 == 0 else _req(i, 4, 6) for i in range(count)]


def test_request_work_is_prompt_plus_every_completion():
    assert request_work(_req(0, 7, 5)) == 12
    assert request_work(_req(0, 7, 5, n=3)) == 22
    bad = GenerationRequest(0, [5], SamplingParams(max_tokens="x"))     # the replica rejects it at once
    assert request_work(bad) == 1


def test_request_work_caps_completions_at_max_model_len_as_the_engine_does():
    assert request_work(_req(0, 7, 5000), max_model_len=32) == 7 + 25
    assert request_work(_req(0, 7, 5000, n=2), max_model_len=32) == 7 + 2 * 25
    assert request_work(_req(0, 7, 5), max_model_len=32) == 12           # under the cap: unchanged
    assert request_work(_req(0, 40, 5), max_model_len=32) == 40 + 1       # prompt past the cap: at least 1


def test_pick_balances_expected_tokens_not_counts():
    reqs = _mixed(40)
    loads = [ReplicaLoad(), ReplicaLoad()]
    longs = [0, 0]
    for r in reqs:
        i = pick(loads, bound=1000)
        loads[i].sent(request_work(r))
        longs[i] += request_work(r) > 20
    work = sum(map(request_work, reqs))
    assert sum(x.work for x in loads) == work
    assert abs(loads[0].work - loads[1].work) <= max(map(request_work, reqs))
    assert longs == [10, 10]
    # alternating by count, as the dispatch did, puts every long request on replica 0
    assert sum(map(request_work, reqs[0::2])) > 9 * sum(map(request_work, reqs[1::2]))


def test_pick_respects_the_bound_and_counts_work_until_it_arrives():
    loads = [ReplicaLoad(), ReplicaLoad()]
    for _ in range(3):
        loads[0].sent(10)
    loads[1].sent(100)
    assert pick(loads, bound=4) == 0          # less work, though more requests
    assert pick(loads, bound=3) == 1          # replica 0 is at the bound
    loads[1].sent(1)
    loads[1].sent(1)
    assert pick(loads, bound=3) is None       # every replica at the bound: read no further
    loads[1].arrived(1)                       # its long request came back, not yet written
    assert (loads[1].work, loads[1].unwritten) == (2, 3)
    assert pick(loads, bound=4) == 1
    loads[1].written()
    assert pick(loads, bound=3) == 1


# -- the replica's source -----------------------------------------------------------------------------
def test_replica_source_yields_none_while_the_engine_has_work():
    inbox: queue.Queue = queue.Queue()
    end = StreamEnd(EngineStats())
    a, b, c = _req(0, 2, 2), _req(1, 2, 2), _req(2, 2, 2)
    src = _requests(("reqs", [a, b]), inbox, lambda: True, end)
    assert [next(src), next(src), next(src), next(src)] == [a, b, None, None]
    inbox.put(("reqs", [c]))
    assert next(src) is c

    def idle() -> bool:             # the engine ran dry: the parent's next message comes while it waits
        inbox.put(("end",))
        return False

    src_idle = _requests(("reqs", []), inbox, idle, end)
    assert list(src_idle) == []
    assert end.input_waits == 1 and end.input_wait_s >= 0.0
    assert (end.input_waits, list(_requests(("end",), inbox, lambda: True, end))) == (1, [])
    inbox.put(("close",))
    with pytest.raises(_Closed):
        list(_requests(("reqs", [a]), inbox, lambda: False, end))


def test_engine_steps_before_its_read_ahead_fills():
    """LLM.stream given None steps instead of reading on: the first request finishes before the second
    is even read, with the read-ahead window (64) far from full."""
    from paddle_mla.config.schema import load_config
    from paddle_mla.engine.llm import LLM

    llm = LLM(load_config(None, ("device=cpu",)))
    reqs = [_req(0, 3, 4), _req(1, 3, 2)]
    nones = 0

    def source():
        nonlocal nones
        yield reqs[0]
        while llm.core.has_work():
            nones += 1
            yield None
        yield reqs[1]

    outs = list(llm.stream(source()))
    assert [o.id for o in outs] == [0, 1] and [len(o.token_ids) for o in outs] == [4, 2]
    assert nones >= 4                                   # one step (at least) per None
    assert outs[0].metrics.finish_time <= outs[1].metrics.arrival_time
    llm.close()


# -- the parent's stream, with the replicas faked ------------------------------------------------------
class _FakeReplica:
    def __init__(self, index: int):
        self.index = index
        self.outputs: deque = deque()
        self.load = ReplicaLoad()
        self.run = ReplicaRun(index)
        self.stats = EngineStats()
        self.done = False
        self.got: list[GenerationRequest] = []          # every request sent to it, in order
        self.answered = 0


def _output(req: GenerationRequest) -> RequestOutput:
    toks = [1] * req.params.max_tokens
    metrics = RequestMetrics(arrival_time=0.0, first_token_time=1.0, token_times=[1.0] * len(toks), finish_time=1.0)
    return RequestOutput(id=req.id, prompt_token_ids=req.prompt_token_ids,
                         outputs=[CompletionOutput(index=0, token_ids=toks, text=None, finish_reason="length")],
                         error=None, metrics=metrics)


def _fake_llm(monkeypatch, size: int, bound: int, events: list):
    llm = object.__new__(dp.DataParallelLLM)
    llm.replicas = [_FakeReplica(i) for i in range(size)]
    llm.bound, llm._broken, llm.max_model_len = bound, False, 1 << 20

    def send(self, r, msg, quiet=False):
        events.append((msg[0], r.index))
        if msg[0] == "reqs":
            r.got.extend(msg[1])

    def pump(self):
        """Every replica answers what it was sent and has not answered, the last one first."""
        events.append(("pump", None))
        for r in reversed(self.replicas):
            new = r.got[r.answered:]
            r.answered = len(r.got)
            if new:
                self._handle(r, ("outs", [_output(q) for q in new], EngineStats()))

    monkeypatch.setattr(dp.DataParallelLLM, "_send", send)
    monkeypatch.setattr(dp.DataParallelLLM, "_pump", pump)
    monkeypatch.setattr(dp.DataParallelLLM, "_recv_one", lambda self, r: ("done", StreamEnd(EngineStats(), 0.5, 2)))
    return llm


def test_stream_sends_every_request_before_waiting_and_balances_work(monkeypatch):
    events: list = []
    llm = _fake_llm(monkeypatch, 2, bound=1000, events=events)
    reqs = _mixed(300)
    outs = list(llm.stream(reqs))
    assert [o.id for o in outs] == list(range(300))
    first_pump = events.index(("pump", None))
    assert [e for e in events[:first_pump] if e[0] == "end"] == [("end", 0), ("end", 1)]
    sent = [q.id for r in llm.replicas for q in r.got]
    assert sorted(sent) == list(range(300))                 # each request once
    runs = llm.replica_runs()
    assert abs(runs[0].work - runs[1].work) <= max(map(request_work, reqs))
    assert sum(r.output_tokens for r in runs) == sum(q.params.max_tokens for q in reqs)
    assert [(r.input_wait_s, r.input_waits) for r in runs] == [(0.5, 2), (0.5, 2)]
    assert all(r.load == ReplicaLoad() for r in llm.replicas)   # nothing left in the books


def test_stream_under_a_tight_bound_loses_and_repeats_nothing(monkeypatch):
    """With a bound of 4 unwritten requests a replica, the parent waits for outputs between dispatches
    and tops the replicas up as they are written: every request once, in order."""
    events: list = []
    llm = _fake_llm(monkeypatch, 3, bound=4, events=events)
    reqs = [_req(i, 3, 1 + i % 5) for i in range(50)]
    outs = list(llm.stream(reqs))
    assert [o.id for o in outs] == list(range(50))
    assert sorted(q.id for r in llm.replicas for q in r.got) == list(range(50))
    assert events.count(("pump", None)) > 1                  # the bound held the dispatch back
    assert [e for e in events if e[0] == "end"] == [("end", 0), ("end", 1), ("end", 2)]
