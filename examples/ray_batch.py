"""Batch inference on a Ray cluster: JSONL in, JSONL out, one paddle-mla engine per Ray actor.

    pip install -e '.[torch,ray]'
    # on this machine (a local Ray instance is started):
    python examples/ray_batch.py -i prompts.jsonl -o out.jsonl --replicas 2 --num-gpus 1
    # on a running cluster (`ray start --head` on one host, `ray start --address HEAD:6379` on the others):
    python examples/ray_batch.py -i prompts.jsonl -o out.jsonl --address auto --replicas 16 --num-gpus 1 \\
        --config my_model.yaml

Input lines are ``paddle-mla generate`` input lines (plain or OpenAI batch lines, see
``paddle-mla generate --help``); the output file has one line per input line, in input order, in
``generate``'s output format, so for greedy lines it is the file ``paddle-mla generate`` writes.
The driver reads the input (numbering lines as ``generate`` does) and writes the output; Ray Data
streams the rows to ``--replicas`` actors (``map_batches`` with ``concurrency``), each holding one
engine on ``--num-gpus`` GPUs (set it to the config's ``parallel.tensor_parallel_size``). The model
folder must be readable at the same path on every host. Unlike ``generate``: a repeated id is
flagged only within its batch, and there is no ``--resume``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's paddle_mla, when not installed

from paddle_mla.batch.io import OutputWriter, iter_input  # noqa: E402
from paddle_mla.integrations.ray_data import LLMPredictor  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-i", "--input", required=True, help="input JSONL file (paddle-mla generate input lines)")
    ap.add_argument("-o", "--output", required=True, help="output JSONL file (replaced)")
    ap.add_argument("--config", default=None, help="engine config YAML (default: the built-in tiny model)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, as paddle-mla generate --set (repeatable)")
    ap.add_argument("--address", default="local",
                    help="Ray cluster: 'local' starts a Ray instance here; 'auto' or HOST:PORT or ray://HOST:10001 "
                         "joins a running cluster (default: local)")
    ap.add_argument("--replicas", type=int, default=1, help="actors, one engine each (map_batches concurrency)")
    ap.add_argument("--num-gpus", type=float, default=0, help="GPUs per actor (the tensor-parallel size; 0 on CPU)")
    ap.add_argument("--num-cpus", type=float, default=1, help="CPUs per actor")
    ap.add_argument("--batch-size", type=int, default=256, help="rows per map_batches call")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray

    if not ray.is_initialized():
        ray.init(address=None if args.address == "local" else args.address)
    ray.data.DataContext.get_current().execution_options.preserve_order = True   # outputs in input order
    with open(args.input, "rb") as f:
        rows = [{"line": n, "json": raw} for n, raw in iter_input(f)]
    t0 = time.perf_counter()
    ds = ray.data.from_items(rows).map_batches(
        LLMPredictor, fn_constructor_kwargs={"config": args.config, "overrides": args.overrides},
        concurrency=args.replicas, num_gpus=args.num_gpus, num_cpus=args.num_cpus, batch_size=args.batch_size)
    writer = OutputWriter(args.output, append=False)
    errors = 0
    try:
        for row in ds.iter_rows():
            writer.write(json.loads(row["record"]))
            errors += row["error"] is not None
    finally:
        writer.close()
    print(f"{writer.lines} lines ({errors} errors) in {time.perf_counter() - t0:.1f}s -> {args.output}",
          file=sys.stderr)
    return 3 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
