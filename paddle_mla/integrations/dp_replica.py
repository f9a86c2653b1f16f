"""The replica process of data parallelism (``data_parallel.py`` is the parent): load one ``LLM``,
report ready, then run one ``stream`` per sequence of request batches the parent sends, with the
pipes drained and filled by threads so the engine thread never waits on them. The engine steps as
soon as it holds requests and takes later batches between steps: it blocks on its input only when it
has nothing to run, and reports how long that was. Imports no tensor library until the engine loads."""

from __future__ import annotations

import copy
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

from paddle_mla.config.schema import ConfigError, EngineConfig
from paddle_mla.sched.request import EngineStats, GenerationRequest


@dataclass
class ReplicaSpec:
    index: int
    config: EngineConfig
    env: dict[str, str]            # set in the replica's environment (CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS)


@dataclass
class StreamEnd:
    """A replica's last message of a stream, after its last output: its statistics, and how long its
    engine sat idle waiting for the parent's next requests (not counting the wait for the first)."""

    stats: EngineStats
    input_wait_s: float = 0.0
    input_waits: int = 0
    tail_s: float = 0.0            # from the engine's last output to the end of its stream


# -- the replica process ----------------------------------------------------------------------------
def _read_inbox(conn, inbox: queue.Queue) -> None:
    """Drain the parent's pipe at once, so the parent never blocks sending while this replica steps."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):     # the parent is gone (killed, or left with os._exit): nobody reads us
            os._exit(1)
        inbox.put(msg)
        if msg[0] == "close":
            return


def _send_outbox(conn, outbox: queue.Queue) -> None:
    """Send what the engine thread queued, all that has gathered as one message: ("outs", [...], stats)
    for outputs, any other message as it is, in order; None ends the thread."""
    while True:
        msg = outbox.get()
        outs, stats = [], None
        while msg and msg[0] == "out":
            outs.append(msg[1])
            stats = msg[2]
            try:
                msg = outbox.get_nowait()
            except queue.Empty:
                msg = ()
        try:
            if outs:
                conn.send(("outs", outs, stats))
            if msg:
                conn.send(msg)
        except OSError:               # the parent is gone: nobody reads us
            os._exit(1)
        except BaseException:         # noqa: BLE001 - a message that cannot be sent: die, so the parent says so
            traceback.print_exc()
            os._exit(1)
        if msg is None:
            return


def replica_main(spec: ReplicaSpec, inbox_conn, outbox_conn) -> None:
    """Load one LLM, report ready, then run one ``stream`` per ("reqs"..., "end") sequence of the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the parent's to handle; it stops the replicas
    try:
        from paddle_mla.engine.llm import LLM

        llm = LLM(spec.config)
    except BaseException as exc:  # noqa: BLE001 - every load failure is reported to the parent as it is
        errors = exc.errors if isinstance(exc, ConfigError) else None
        outbox_conn.send(("load_error", type(exc).__name__, str(exc), errors, traceback.format_exc()))
        return
    outbox_conn.send(("ready", llm.describe(), llm.max_model_len, llm.default_params(), llm.stream_window,
                      llm.model_dir))
    inbox: queue.Queue = queue.Queue()
    outbox: queue.Queue = queue.Queue()
    threading.Thread(target=_read_inbox, args=(inbox_conn, inbox), daemon=True).start()
    sender = threading.Thread(target=_send_outbox, args=(outbox_conn, outbox), daemon=True)
    sender.start()
    exit_code = 0
    try:
        while True:
            msg = inbox.get()
            if msg[0] == "close":
                break
            if msg[0] == "reset":
                llm.reset_stats()
                continue
            end = StreamEnd(EngineStats())
            last = time.perf_counter()
            for out in llm.stream(_requests(msg, inbox, llm.core.has_work, end)):
                outbox.put(("out", out, copy.copy(llm.stats())))
                last = time.perf_counter()
            end.tail_s = time.perf_counter() - last
            end.stats = copy.copy(llm.stats())
            outbox.put(("done", end))
    except _Closed:
        pass
    except BaseException:  # noqa: BLE001 - the parent prints it, with which replica it was
        exit_code = 1
        outbox.put(("error", traceback.format_exc()))
    finally:
        outbox.put(None)
        sender.join()
        llm.close()
    sys.exit(exit_code)


class _Closed(Exception):
    pass


def _requests(first: tuple, inbox: queue.Queue, busy, end: StreamEnd) -> Iterator[GenerationRequest | None]:
    """The requests of the ("reqs"..., "end") sequence starting at ``first``. While the next batch has
    not arrived and the engine has work (``busy()``), yield None so that ``LLM.stream`` steps instead
    of waiting for its read-ahead window to fill; only an idle engine blocks on the pipe, and that
    wait goes into ``end``."""
    msg = first
    while msg[0] == "reqs":
        yield from msg[1]
        msg = None
        while msg is None:
            try:
                msg = inbox.get_nowait()
            except queue.Empty:
                if busy():
                    yield None
                    continue
                t = time.perf_counter()
                msg = inbox.get()
                end.input_wait_s += time.perf_counter() - t
                end.input_waits += 1
    if msg[0] == "close":
        raise _Closed
