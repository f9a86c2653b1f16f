"""``load_format: dummy``: random weights built on each rank's device, for benchmarks (vLLM's name).

The only input is the model folder's ``config.json``. ``checkpoint_layout`` (``models/layout.py``)
lists the tensors a published checkpoint of those dimensions holds (names, shapes, safetensors
dtypes). ``DummyLoader`` is the streaming loader
(``paddle_mla.models.loader``) reading that layout instead of files: the same plan, the same
tensor-parallel shards (``paddle_mla.models.sharding``), the same FP8 keep / dequantize choices
and expert stacking; only the one place where bytes come from a file (``_raw``) makes them on the
device instead, already in the target dtype and already this rank's shard. No weights travel and
nothing is written.

Values: linear weights and embeddings ~ N(0, std) with std = ``initializer_range`` (0.02 when the
config has none), as a real init, so activations stay finite and the router's scores spread over
the experts (routing is not degenerate); FP8 weights are N(0, 1) in e4m3 with block scales of
std (the same spread after dequantization); norms are ones; biases zeros. Every tensor is seeded
from its name, so replicated tensors are the same on every rank. Values are not those of any
checkpoint, and a TP=2 engine's weights are not slices of a TP=1 engine's: outputs are noise. For
benchmarks only.
"""

from __future__ import annotations

import zlib
from typing import Any

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.models.arch import ModelArch
from paddle_mla.models.layout import checkpoint_layout
from paddle_mla.models.loader import StreamingLoader, _TORCH_DTYPES

DEFAULT_STD = 0.02
_NORMS = ("norm.weight", "layernorm.weight")
_ZEROS = (".bias", "e_score_correction_bias")


class DummyReader:
    """The part of ``CheckpointReader`` (and of one file) the loader uses, over ``checkpoint_layout``."""

    _SIZES = {"F32": 4, "BF16": 2, "F8_E4M3": 1}

    def __init__(self, arch: ModelArch):
        self.layout = checkpoint_layout(arch)

    def keys(self) -> list[str]:
        return list(self.layout)

    def __contains__(self, name: str) -> bool:
        return name in self.layout

    def file_of(self, name: str) -> "DummyReader":
        return self

    def dtype(self, name: str) -> str:
        return self.layout[name][1]

    def shape(self, name: str) -> list[int]:
        return list(self.layout[name][0])

    def nbytes(self, name: str) -> int:
        shape, dt = self.layout[name]
        n = self._SIZES[dt]
        for s in shape:
            n *= s
        return n


class DummyLoader(StreamingLoader):
    """The streaming loader over ``DummyReader``: one thread (tensors are made on the device in
    order, each seeded from its name), no progress bar (nothing is read)."""

    def __init__(self, arch: ModelArch, dtype: Any, device: str, seed: int = 0, **kwargs):
        kwargs.update(threads=1, progress=False)
        super().__init__(None, arch, dtype, device, reader=DummyReader(arch), **kwargs)
        self.std = float(arch.raw.get("initializer_range") or DEFAULT_STD)
        self.seed = seed

    def _raw(self, name: str, target=None, transient: bool = False, shard=None):
        shape = self.reader.shape(name)
        if shard is not None:
            shape = shard.shape(shape)
        stored = getattr(torch, _TORCH_DTYPES[self.reader.dtype(name)])
        dtype = target if target is not None else stored
        if name.endswith("_scale_inv"):
            return torch.full(shape, self.std, dtype=dtype, device=self.device)
        if name.endswith(_ZEROS):
            return torch.zeros(shape, dtype=dtype, device=self.device)
        if name.endswith(_NORMS):
            return torch.ones(shape, dtype=dtype, device=self.device)
        torch.manual_seed(self.seed ^ zlib.crc32(name.encode()))
        if dtype == torch.float8_e4m3fn:    # N(0, 1) codes (through fp32: any runtime); the scales carry std
            return torch.empty(shape, dtype=torch.float32, device=self.device).normal_(0.0, 1.0).to(dtype)
        return torch.empty(shape, dtype=dtype, device=self.device).normal_(0.0, self.std)


def dummy_weights(arch: ModelArch, dtype: Any, device: str, **kwargs) -> dict[str, Any]:
    """What ``load_weights`` returns for a checkpoint of ``arch``'s layout, with random values."""
    return DummyLoader(arch, dtype, device, **kwargs).load()
