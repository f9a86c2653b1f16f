"""Seeded synthetic workloads for ``paddle-mla bench``, each described by a few parameters.

Spelled on the command line as ``KIND:key=value,...`` (e.g. ``random:num_prompts=64,input_len=128``)
or as a YAML file holding one workload (a mapping with ``kind``) or several named ones
(``FILE.yaml#name`` picks one). Kinds and their parameters (defaults in ``KINDS``):

- random: prompt and output lengths drawn uniformly from ``len * [1 - range_ratio, 1 + range_ratio]``;
- shared-prefix: ``num_prefixes`` random prefixes of ``prefix_len`` tokens; a ``shared_fraction``
  of the prompts start with one of them, the rest with a fresh prefix; then ``suffix_len``
  random tokens;
- long-context: a few long prompts (``input_len``) with short outputs.

Token ids are drawn uniformly from the vocabulary minus special tokens. Outputs use greedy
sampling with ``ignore_eos`` so every request produces exactly its output length.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from paddle_mla.config.schema import yaml_error_text

KINDS: dict[str, dict[str, float | int]] = {
    "random": {"num_prompts": 64, "input_len": 128, "output_len": 32, "range_ratio": 0.0, "seed": 0},
    "shared-prefix": {"num_prompts": 64, "prefix_len": 256, "suffix_len": 32, "output_len": 32,
                      "shared_fraction": 1.0, "num_prefixes": 1, "seed": 0},
    "long-context": {"num_prompts": 4, "input_len": 4096, "output_len": 16, "range_ratio": 0.0, "seed": 0},
}


class WorkloadError(ValueError):
    pass


@dataclass(frozen=True)
class Workload:
    kind: str
    params: dict[str, Any]
    name: str = ""

    def describe(self, seed: bool = True) -> str:
        return f"{self.kind}:" + ",".join(f"{k}={v}" for k, v in self.params.items() if seed or k != "seed")

    def with_seed_offset(self, offset: int) -> Workload:
        return dataclasses.replace(self, params={**self.params, "seed": self.params["seed"] + offset})

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name or self.kind, "kind": self.kind, **self.params}


def make_workload(kind: str, params: dict[str, Any], name: str = "") -> Workload:
    if kind not in KINDS:
        raise WorkloadError(f"unknown workload kind {kind!r}; kinds: {', '.join(KINDS)}")
    defaults = KINDS[kind]
    out = dict(defaults)
    for key, value in params.items():
        if key not in defaults:
            raise WorkloadError(f"workload {kind}: unknown parameter {key!r}; parameters: {', '.join(defaults)}")
        want = type(defaults[key])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (want is int and value != int(value)):
            raise WorkloadError(f"workload {kind}: {key} must be {'an integer' if want is int else 'a number'}, "
                                f"got {value!r}")
        out[key] = want(value)
    for key in ("num_prompts", "input_len", "output_len", "prefix_len", "num_prefixes"):
        if key in out and out[key] < 1:
            raise WorkloadError(f"workload {kind}: {key} must be >= 1, got {out[key]}")
    if "suffix_len" in out and out["suffix_len"] < 0:
        raise WorkloadError(f"workload {kind}: suffix_len must be >= 0")
    if not 0.0 <= out.get("range_ratio", 0.0) < 1.0:
        raise WorkloadError(f"workload {kind}: range_ratio must be in [0, 1)")
    if not 0.0 <= out.get("shared_fraction", 0.0) <= 1.0:
        raise WorkloadError(f"workload {kind}: shared_fraction must be in [0, 1]")
    return Workload(kind, out, name)


def parse_workload(spec: str) -> Workload:
    """``KIND[:k=v,...]`` or ``FILE.yaml[#name]``."""
    path, _, name = spec.partition("#")
    if path.endswith((".yaml", ".yml")):
        return _from_file(Path(path), name)
    kind, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = part.partition("=")
        if not eq:
            raise WorkloadError(f"workload {spec!r}: expected key=value, got {part!r}")
        params[key.strip()] = yaml.safe_load(raw)
    return make_workload(kind.strip(), params)


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise WorkloadError(f"{path}: workload file not found") from None
    except yaml.YAMLError as exc:
        raise WorkloadError(yaml_error_text(path, exc)) from None


def _entry(path: Path, name: str, data: Any) -> Workload:
    """One workload mapping of a file (``name`` empty for a file that is a single workload)."""
    where = f"{path}{'#' + name if name else ''}"
    if not isinstance(data, dict):
        raise WorkloadError(f"{where}: expected a mapping with 'kind' and parameters")
    data = dict(data)
    kind = data.pop("kind", None)
    if not isinstance(kind, str):
        raise WorkloadError(f"{where}: 'kind' must be one of {', '.join(KINDS)}")
    try:
        return make_workload(kind, data, name)
    except WorkloadError as exc:
        raise WorkloadError(f"{where}: {exc}") from None


def _from_file(path: Path, name: str) -> Workload:
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}: expected a mapping (one workload with 'kind', or name: workload)")
    if "kind" not in data:
        if not name:
            if len(data) != 1:
                raise WorkloadError(f"{path} holds several workloads; pick one: {path}#NAME with NAME in "
                                    f"{', '.join(map(str, data))}")
            name = next(iter(data))
        if name not in data or not isinstance(data[name], dict):
            raise WorkloadError(f"{path}: no workload {name!r}; workloads: {', '.join(map(str, data))}")
        data = data[name]
    return _entry(path, name, data)


def is_workload_file(path: str | Path) -> bool:
    """Whether ``path`` holds workloads rather than an engine config: one workload (a mapping with
    ``kind``) or named ones, at least one with ``kind``. No engine config key is named ``kind``,
    at the top level or in a section. False for a file that cannot be read or parsed (the config
    loader then reports why)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    if not isinstance(data, dict):
        return False
    return "kind" in data or any(isinstance(v, dict) and "kind" in v for v in data.values())


class WorkloadFileError(WorkloadError):
    """Every problem of a workload file, one per entry."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


def read_workload_file(path: str | Path) -> list[Workload]:
    """Every workload of a file, parameters resolved (defaults filled in); WorkloadFileError lists
    the problem of each bad entry."""
    path = Path(path)
    try:
        data = _read_yaml(path)
    except WorkloadError as exc:
        raise WorkloadFileError([str(exc)]) from None
    entries = [("", data)] if isinstance(data, dict) and "kind" in data else \
        list(data.items()) if isinstance(data, dict) else [("", data)]
    workloads, errors = [], []
    for name, entry in entries:
        try:
            workloads.append(_entry(path, str(name), entry))
        except WorkloadError as exc:
            errors.append(str(exc))
    if errors:
        raise WorkloadFileError(errors)
    return workloads


def special_token_ids(tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for attr in ("all_special_ids", "special_token_ids", "eos_token_ids"):
        ids.update(int(i) for i in (getattr(tokenizer, attr, None) or ()))
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            ids.add(value)
    return ids


def _length_range(mean: int, ratio: float) -> tuple[int, int]:
    """The lengths a ``mean`` length with ``range_ratio`` ``ratio`` is drawn from (inclusive)."""
    return max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))


def longest_sequence(w: Workload) -> int:
    """The most tokens one request of ``w`` can need: its longest prompt and output together."""
    p = w.params
    if w.kind == "shared-prefix":
        return p["prefix_len"] + p["suffix_len"] + p["output_len"]
    return _length_range(p["input_len"], p["range_ratio"])[1] + _length_range(p["output_len"], p["range_ratio"])[1]


def check_fits(w: Workload, max_model_len: int, given: str | None = None) -> None:
    """Refuse a workload whose requests may not fit ``max_model_len``, quoting it as ``given`` (what
    the user wrote; by default its kind and parameters, without the seed, which a repeat derives)."""
    need = longest_sequence(w)
    if need > max_model_len:
        raise WorkloadError(f"workload {given or w.describe(seed=False)!r} needs up to {need} tokens per sequence "
                            f"(prompt + output); max_model_len is {max_model_len}: shorten "
                            f"{'prefix_len/suffix_len' if w.kind == 'shared-prefix' else 'input_len'}/output_len")


def build_requests(w: Workload, tokenizer: Any, request_cls: type, params_cls: type, max_model_len: int) -> list:
    """The workload's requests (GenerationRequest), identical for every config given the same seed."""
    check_fits(w, max_model_len)
    p = w.params
    rng = np.random.default_rng(p["seed"])
    allowed = np.setdiff1d(np.arange(tokenizer.vocab_size), np.fromiter(special_token_ids(tokenizer), dtype=np.int64))
    n = p["num_prompts"]

    def lengths(mean: int, ratio: float) -> np.ndarray:
        lo, hi = _length_range(mean, ratio)
        return rng.integers(lo, hi + 1, size=n)

    def tokens(k: int) -> list[int]:
        return allowed[rng.integers(0, len(allowed), size=k)].tolist()

    if w.kind == "shared-prefix":
        prefixes = [tokens(p["prefix_len"]) for _ in range(p["num_prefixes"])]
        shared = rng.random(n) < p["shared_fraction"]
        choice = rng.integers(0, p["num_prefixes"], size=n)
        prompts = [(prefixes[c] if s else tokens(p["prefix_len"])) + tokens(p["suffix_len"])
                   for s, c in zip(shared, choice)]
        outs = np.full(n, p["output_len"])
    else:
        prompts = [tokens(int(k)) for k in lengths(p["input_len"], p["range_ratio"])]
        outs = lengths(p["output_len"], p["range_ratio"])
    return [request_cls(id=i, prompt_token_ids=ids,
                        params=params_cls(temperature=0.0, max_tokens=int(k), ignore_eos=True, seed=0))
            for i, (ids, k) in enumerate(zip(prompts, outs))]
