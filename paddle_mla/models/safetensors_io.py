"""Reading (and writing) safetensors with numpy only, so loading is the same on both runtimes.

Two ways in:
- ``read_into``: a tensor's raw bytes, read with ``pread`` straight into a caller's buffer (the
  streaming loader: no decode on the host, no staging copy; the page cache is not part of the
  process's RSS, whereas mapped file pages would be, so a large checkpoint's peak RSS stays near
  the tensors in flight);
- ``get``: a memory-mapped numpy view decoded to a numpy dtype (tests and tools). numpy has no
  bfloat16 / float8, so those become float32: bf16 by a bit shift, float8 e4m3fn through a
  256-entry table; FP8 weights with ``<name>_scale_inv`` block scales (DeepSeek-V3: 128x128
  blocks, partial blocks at the edges) come back dequantized.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

_NP_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_RAW_DTYPES = {"BF16": np.uint16, "F8_E4M3": np.uint8}
# numpy dtype with the stored element size, for handing raw bytes to a tensor library that
# reinterprets them (bf16 as int16 -> bfloat16, fp8 as uint8 -> float8_e4m3fn)
RAW_VIEW_DTYPES = {**_NP_DTYPES, "BF16": np.int16, "F8_E4M3": np.uint8}


def _e4m3fn_table() -> np.ndarray:
    """float32 value of each float8_e4m3fn byte (bias 7, no infinities, 0x7f/0xff are NaN)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    normal = (1.0 + man / 8.0) * np.power(2.0, exp - 7.0)
    subnormal = (man / 8.0) * 2.0 ** -6
    vals = sign * np.where(exp == 0, subnormal, normal)
    vals[(exp == 15) & (man == 7)] = np.nan
    return vals.astype(np.float32)


E4M3_TABLE = _e4m3fn_table()


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Raw stored array -> numpy array (bf16 and fp8 become float32)."""
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F8_E4M3":
        return E4M3_TABLE[raw]
    return raw


class SafetensorsFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        self.header = header
        self._data_start = 8 + n
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")

    def keys(self) -> list[str]:
        return list(self.header)

    def dtype(self, name: str) -> str:
        return self.header[name]["dtype"]

    def shape(self, name: str) -> list[int]:
        return list(self.header[name]["shape"])

    def nbytes(self, name: str) -> int:
        begin, end = self.header[name]["data_offsets"]
        return end - begin

    def read_into(self, name: str, buf: np.ndarray, offset: int = 0, count: int | None = None) -> np.ndarray:
        """Read tensor ``name``'s raw bytes (or ``count`` of them from byte ``offset``: a tensor-parallel
        rank's rows) into ``buf`` (uint8, large enough) with pread; returns the filled prefix.
        Thread-safe: pread carries its own offset."""
        begin, end = self.header[name]["data_offsets"]
        n = end - begin - offset if count is None else count
        if offset < 0 or offset + n > end - begin:
            raise ValueError(f"{self.path.name}: bytes [{offset}, {offset + n}) are outside tensor {name}")
        begin += offset
        out = buf[:n]
        view = memoryview(out)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            done = 0
            while done < n:      # Linux returns at most ~2 GiB per call
                got = os.preadv(fd, [view[done:]], self._data_start + begin + done)
                if got <= 0:
                    raise OSError(f"{self.path.name}: short read of {name} ({done} of {n} bytes)")
                done += got
        finally:
            os.close(fd)
        return out

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        begin, end = info["data_offsets"]
        dt = info["dtype"]
        np_dt = _NP_DTYPES.get(dt) or _RAW_DTYPES.get(dt)
        if np_dt is None:
            raise ValueError(f"{self.path.name}: tensor {name} has unsupported dtype {dt}")
        buf = self._mm[self._data_start + begin:self._data_start + end]
        raw = np.frombuffer(buf, dtype=np_dt).reshape(info["shape"])
        return decode(raw, dt)


class CheckpointReader:
    """All tensors of a checkpoint folder: ``model.safetensors`` or a sharded index."""

    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        index = model_dir / "model.safetensors.index.json"
        self._files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, str] = {}
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            for name, fname in weight_map.items():
                self._where[name] = fname
        else:
            files = sorted(model_dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors (or model.safetensors.index.json) in {model_dir}")
            for p in files:
                for name in self._file(model_dir, p.name).keys():
                    self._where[name] = p.name
        self._dir = model_dir

    def _file(self, model_dir: Path, fname: str) -> SafetensorsFile:
        if fname not in self._files:
            self._files[fname] = SafetensorsFile(model_dir / fname)
        return self._files[fname]

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def dtype(self, name: str) -> str:
        return self._file(self._dir, self._where[name]).dtype(name)

    def file_of(self, name: str) -> SafetensorsFile:
        return self._file(self._dir, self._where[name])

    def get(self, name: str, block_size: tuple[int, int] = (128, 128)) -> np.ndarray:
        """The tensor as numpy; an FP8 weight with a ``_scale_inv`` companion comes back dequantized."""
        arr = self._file(self._dir, self._where[name]).get(name)
        scale_name = name + "_scale_inv"
        if self.dtype(name) == "F8_E4M3" and scale_name in self._where:
            arr = dequant_fp8_blocks(arr, self.get(scale_name).astype(np.float32), block_size)
        return arr


def dequant_fp8_blocks(w: np.ndarray, scale_inv: np.ndarray, block_size: tuple[int, int] = (128, 128)) -> np.ndarray:
    """w (already decoded to float32) [R, C] times its [ceil(R/br), ceil(C/bc)] block scales."""
    br, bc = block_size
    rows, cols = w.shape
    full = np.repeat(np.repeat(scale_inv, br, axis=0), bc, axis=1)[:rows, :cols]
    return (w.astype(np.float32) * full).astype(np.float32)


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest float8_e4m3fn byte (saturating at +-448); for tests and tools."""
    finite = np.where(np.isnan(E4M3_TABLE), np.inf, E4M3_TABLE)
    order = np.argsort(finite, kind="stable")
    sorted_vals = finite[order]
    xc = np.clip(x.astype(np.float32), -448.0, 448.0).ravel()
    hi = np.clip(np.searchsorted(sorted_vals, xc), 1, len(sorted_vals) - 1)
    lo = hi - 1
    pick = np.where(np.abs(sorted_vals[hi] - xc) < np.abs(sorted_vals[lo] - xc), hi, lo)
    return order[pick].astype(np.uint8).reshape(x.shape)


_DT_NAMES = {np.dtype(v): k for k, v in _NP_DTYPES.items()}


def save_file(tensors: dict[str, np.ndarray], path: str | Path, raw_dtypes: dict[str, str] | None = None,
              metadata: dict[str, str] | None = None) -> None:
    """Write numpy arrays as safetensors; ``raw_dtypes`` marks uint8 arrays as F8_E4M3 (or uint16 as BF16)."""
    raw_dtypes = raw_dtypes or {}
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        dt = raw_dtypes.get(name) or _DT_NAMES[arr.dtype]
        data = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    hbytes = json.dumps(header, separators=(",", ":")).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        f.writelines(blobs)
