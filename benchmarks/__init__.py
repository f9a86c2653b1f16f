"""Benchmarks and profilers of paddle_mla (not part of the installed package). Run from the repo root:

    python -m benchmarks.kernels.mla_decode --help

- ``harness/``: what the scripts share (timing, copy bandwidth, error metrics, third_party anchor
  loaders, model dims, random checkpoints and weights, step batches, the step probe);
- ``kernels/``: one kernel or op against its anchor (SGLang, SDPA, copy bandwidth);
- ``e2e/``: the engine or its model runner end to end (decode/prefill steps, loader, TP/DP, full size);
- ``profile/``: where the time goes (CUDA profiler kernel tables, host phases, ncu, offline sm_90 compiles).

A script imports ``benchmarks.harness`` (and its own helper module), never another script, so there is
no import cycle between scripts; the harness imports only ``paddle_mla``. BENCHMARKS.md has the results.
"""
