"""The replica process of data parallelism (``data_parallel.py`` is the parent): load one ``LLM``,
report ready, then run one ``stream`` per sequence of request batches the parent sends, with the
pipes drained and filled by threads so the engine thread never waits on them. Imports no tensor
library until the engine loads."""

from __future__ import annotations

import copy
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

from paddle_mla.config.schema import ConfigError, EngineConfig
from paddle_mla.sched.request import GenerationRequest


@dataclass
class ReplicaSpec:
    index: int
    config: EngineConfig
    env: dict[str, str]            # set in the replica's environment (CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS)


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
            for out in llm.stream(_requests(msg, inbox)):
                outbox.put(("out", out, copy.copy(llm.stats())))
            outbox.put(("done", copy.copy(llm.stats())))
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


def _requests(first: tuple, inbox: queue.Queue) -> Iterator[GenerationRequest]:
    msg = first
    while msg[0] == "reqs":
        yield from msg[1]
        msg = inbox.get()
    if msg[0] == "close":
        raise _Closed
