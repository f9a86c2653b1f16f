"""Time of building one step's metadata (``ForwardMeta.build``: uploads + the three metadata ops)
for a batch, with the compiled custom ops and with the plain-tensor reference.

    PADDLE_MLA_RUNTIME=torch python -m benchmarks.kernels.metadata --batch 64 --device cpu
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from paddle_mla.platform import runtime

runtime.select()

from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch  # noqa: E402
from paddle_mla.ops import metadata, reference  # noqa: E402


def step_batches(batch: int, context: int, block_size: int) -> dict[str, StepBatch]:
    rng = np.random.default_rng(0)
    per_seq = -(-(context + 512) // block_size)
    tables = rng.permutation(batch * per_seq).reshape(batch, per_seq).astype(np.int32)
    decode = StepBatch(token_ids=rng.integers(0, 1000, batch), num_new=np.ones(batch, np.int32),
                       num_cached=rng.integers(1, context, batch).astype(np.int32), block_tables=tables,
                       is_prefill=np.zeros(batch, bool), sample_mask=np.ones(batch, bool))
    chunk = np.where(np.arange(batch) % 8 == 0, 256, 1).astype(np.int32)        # 1 in 8 is a prefill chunk
    mixed = StepBatch(token_ids=rng.integers(0, 1000, int(chunk.sum())), num_new=chunk,
                      num_cached=rng.integers(0, context, batch).astype(np.int32), block_tables=tables,
                      is_prefill=chunk > 1, sample_mask=np.ones(batch, bool))
    return {"decode": decode, "mixed": mixed}


def time_build(batch: StepBatch, block_size: int, device: str, iters: int) -> float:
    for _ in range(5):
        ForwardMeta.build(batch, block_size, device)
    runtime.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        ForwardMeta.build(batch, block_size, device)
    runtime.synchronize()
    return (time.perf_counter() - t) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    device = runtime.device_string(args.device)
    compiled = metadata.implementation()
    print(f"runtime {runtime.name()}, device {args.device}, batch {args.batch}, ops: {compiled}, "
          f"threads {os.environ.get('OMP_NUM_THREADS', 'default')}")
    print("| step | compiled ops µs | reference µs |")
    print("| --- | --- | --- |")
    saved = (metadata.get_position_ids, metadata.get_cu_seqlens, metadata.compute_slot_mapping)
    for name, batch in step_batches(args.batch, args.context, args.block_size).items():
        t_ops = time_build(batch, args.block_size, device, args.iters)
        metadata.get_position_ids, metadata.get_cu_seqlens, metadata.compute_slot_mapping = (
            reference.get_position_ids, reference.get_cu_seqlens, reference.compute_slot_mapping)
        t_ref = time_build(batch, args.block_size, device, args.iters)
        metadata.get_position_ids, metadata.get_cu_seqlens, metadata.compute_slot_mapping = saved
        print(f"| {name} (T={int(batch.num_new.sum())}) | {t_ops * 1e6:.0f} | {t_ref * 1e6:.0f} |")


if __name__ == "__main__":
    main()
