"""Counting an engine's CUDA-graph replays, so a GPU test can show its decode steps ran as graphs."""

from __future__ import annotations


def count_graph_replays(llm) -> dict:
    """Wraps ``llm.runner.graphs.run``; the returned dict's ``"n"`` is the replays since."""
    replays = {"n": 0}
    run = llm.runner.graphs.run

    def counted(meta):
        replays["n"] += 1
        return run(meta)

    llm.runner.graphs.run = counted
    return replays
