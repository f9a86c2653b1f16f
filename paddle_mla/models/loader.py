"""HF checkpoint folder -> CausalLM (DeepSeek) or GQACausalLM (qwen3, ernie4_5, llama): config.json +
safetensors (single file or sharded index), streamed.

Tensor names are those of the published checkpoints (transformers' names); for DeepSeek (per-expert
``mlp.experts.E.{gate,up,down}_proj.weight``, which transformers 5 ``save_pretrained`` also
writes); fused ``mlp.experts.gate_up_proj`` [E, 2I, h] / ``mlp.experts.down_proj`` [E, h, I]
are accepted too. Layers >= num_hidden_layers (MTP / nextn) are ignored.

Streaming: each tensor's raw bytes go from the file (pread) to the device in their stored dtype
and are converted there, one tensor per worker thread; nothing is staged in float32 on the host,
so host memory stays near the tensors in flight above the baseline (on CPU the model itself is
host memory, of course). Per-expert tensors are written into their stacked [E, ...] device
tensor as they arrive. FP8 block-scaled weights are kept as ``Fp8Weight`` (e4m3 + fp32 block
scales) when ``keep_fp8`` or dequantized to the model dtype on the device.

Tensor parallel (``tp_rank`` / ``tp_size``): each rank reads only its slice of the sharded tensors
(``paddle_mla.models.sharding``): a row slice is read as just its bytes; a column slice is read
whole into the thread's reusable buffer and only the slice is kept. FP8 weights keep their block
scales' matching slice (dequantized whole, then sliced, when a slice is not block-aligned).
With ``expert_parallel`` a rank reads only its routed experts (``sharding.expert_range``), whole.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.models.arch import ModelArch, load_arch
from paddle_mla.models.deepseek import CausalLM
from paddle_mla.models.fp8 import Fp8Weight, dequant_blocks, fp8_kernels_available
from paddle_mla.models.gqa import GQACausalLM
from paddle_mla.models.layout import FUSED_EXPERTS, check_checkpoint
from paddle_mla.models.safetensors_io import RAW_VIEW_DTYPES, CheckpointReader
from paddle_mla.models.sharding import Shard, checkpoint_shard, expert_range, local_arch, scale_shard, split_range

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
# kept in float32 whatever the model dtype (the router runs in fp32, as in transformers)
_FP32_SUFFIXES = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias",
                  "mlp.moe_statics.e_score_correction_bias")   # ernie4_5_moe's spelling
_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
                 "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def resolve_keep_fp8(quantization: str, device_kind: str) -> bool:
    """Config ``quantization`` -> whether FP8 checkpoint weights stay FP8 here."""
    ok, why = fp8_kernels_available(device_kind)
    if quantization == "none":
        return False
    if quantization == "fp8":
        if not ok:
            raise ValueError(f"quantization: fp8 needs the FP8 kernels, which cannot run here: {why}; "
                             "use quantization: auto or none (FP8 weights dequantized at load)")
        return True
    if quantization == "auto":
        return ok
    raise ValueError(f"quantization must be auto, none or fp8, got {quantization!r}")


# A load shorter than this is over before a bar says anything useful.
LOAD_BAR_MIN_BYTES = 256 << 20


@dataclass
class _Task:
    nbytes: int
    run: Callable[[], None]


class StreamingLoader:
    """Reads the weights the model uses onto ``device``; ``load()`` -> {name: tensor | Fp8Weight}.

    Experts come back stacked as ``<prefix>.{gate,up,down}`` [E, ...]; with ``expert_fp8`` (and
    ``keep_fp8``) an FP8 checkpoint's experts are Fp8Weight [E, N, K] + [E, N/bn, K/bk] scales,
    otherwise they are dequantized to the model dtype.
    """

    def __init__(self, model_dir: str | Path, arch: ModelArch, dtype: Any, device: str, keep_fp8: bool = False,
                 expert_fp8: bool = False, threads: int | None = None, progress: bool = True,
                 tp_rank: int = 0, tp_size: int = 1, reader=None, expert_parallel: bool = False,
                 swa_kv_heads: int = 0, attention_rows: bool = False):
        # ``reader``: another source of the same tensors (load_format: dummy's DummyReader);
        # ``swa_kv_heads``: head-wise SWA's KV heads, balanced over the ranks (sharding._gqa_shard);
        # ``attention_rows``: attention weights whole on every rank (parallel.attention_split: rows)
        self.reader = reader if reader is not None else CheckpointReader(model_dir)
        self.tp_rank, self.tp_size, self.swa_kv_heads = tp_rank, tp_size, swa_kv_heads
        self.expert_parallel = expert_parallel and tp_size > 1
        self.attention_rows = attention_rows
        self.arch, self.dtype, self.device = arch, dtype, device
        self.on_cpu = device == "cpu"
        self.keep_fp8, self.expert_fp8 = keep_fp8, expert_fp8
        self.block = tuple(arch.fp8_block_size or (128, 128))
        # Threads overlap file reads with device copies. On CPU there is no copy to overlap, and
        # tensors created by several threads fragment the host heap (measured: +60 MB on 400 MB).
        self.threads = threads or (1 if self.on_cpu else min(4, os.cpu_count() or 1))
        self.progress = progress
        self.out: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    # ---- one tensor: file -> device, in its stored dtype ----
    def _buffer(self, n: int, fresh: bool) -> np.ndarray:
        """A host buffer for one tensor's bytes: ``fresh`` when it becomes the CPU tensor itself;
        otherwise this thread's reusable one (the device copy / dtype cast is synchronous), so
        no per-tensor host allocation is freed between long-lived tensors to fragment the heap."""
        if fresh:
            return np.empty(n, dtype=np.uint8)
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < n:
            self._local.buf = None
            buf = self._local.buf = np.empty(max(n, 1 << 20), dtype=np.uint8)
        return buf

    def _raw(self, name: str, target=None, transient: bool = False, shard: Shard | None = None):
        """Tensor ``name`` (its ``shard`` only, when given) on the device in its stored dtype; cast to
        ``target`` when given. ``transient``: the caller copies it elsewhere (stacked experts,
        dequant) before this thread reads the next tensor, so on CPU it may live in the thread's
        reusable buffer too."""
        f = self.reader.file_of(name)
        n, st, shape = f.nbytes(name), f.dtype(name), f.shape(name)
        if st not in _TORCH_DTYPES:
            raise ValueError(f"{f.path.name}: tensor {name} has unsupported dtype {st}")
        stored = getattr(torch, _TORCH_DTYPES[st])
        fresh = self.on_cpu and not transient and (target is None or target == stored)
        view = RAW_VIEW_DTYPES[st]
        if shard is None:
            raw = f.read_into(name, self._buffer(n, fresh)).view(view).reshape(shape)
        elif shard.dim == 0 and shard.contiguous:     # rows are contiguous: read only this rank's bytes
            row = n // shape[0]
            raw = f.read_into(name, self._buffer(row * shard.size, fresh), offset=row * shard.start,
                              count=row * shard.size).view(view).reshape(shard.shape(shape))
        else:   # columns, or two row ranges: the whole tensor through the reusable buffer, the slice kept
            whole = f.read_into(name, self._buffer(n, False)).view(view).reshape(shape)
            raw = np.ascontiguousarray(whole[shard.numpy_index()])
        t = torch.from_numpy(raw)
        if t.dtype != stored:
            t = t.view(stored)
        if not self.on_cpu:
            t = t.to(self.device)
        return t if target is None or target == stored else t.to(target)

    def _fp8(self, name: str) -> bool:
        return self.reader.dtype(name) == "F8_E4M3" and (name + "_scale_inv") in self.reader

    def _target(self, name: str):
        return torch.float32 if name.endswith(_FP32_SUFFIXES) else self.dtype

    def _keepable(self, shape) -> bool:
        """Whether an FP8 weight of this shape can run w8a8: whole K groups, and on the GPU a K
        block of >= 32 (the FP8 tensor-core dot's minimum K); others are dequantized."""
        return shape[-1] % self.block[1] == 0 and (self.on_cpu or self.block[1] % 32 == 0)

    def _shard(self, name: str) -> Shard | None:
        """This rank's slice of checkpoint tensor ``name`` (None: all of it)."""
        if self.tp_size == 1:
            return None
        return checkpoint_shard(name, self.reader.file_of(name).shape(name), self.arch, self.tp_rank, self.tp_size,
                                self.expert_parallel, self.swa_kv_heads, self.attention_rows)

    def _shape(self, name: str) -> list[int]:
        """Shape of what this rank holds of ``name``."""
        shape = self.reader.file_of(name).shape(name)
        shard = self._shard(name)
        return shape if shard is None else shard.shape(shape)

    def _convert(self, name: str, keep: bool, transient: bool = False):
        """The tensor (this rank's shard of it) on the device: model dtype, or Fp8Weight when
        ``keep`` and it is block-scaled FP8."""
        shard = self._shard(name)
        if self._fp8(name):
            full = self.reader.file_of(name).shape(name)
            s_shard = scale_shard(shard, full, self.block)
            if shard is not None and s_shard is None:   # not block-aligned: dequantize whole, then slice
                t = self._raw(name, transient=True)
                w = dequant_blocks(t, self._raw(name + "_scale_inv", torch.float32), self.block, self._target(name))
                return w[shard.numpy_index()].contiguous()
            keep = keep and self._keepable(self._shape(name))
            t = self._raw(name, transient=transient or not keep, shard=shard)
            s = self._raw(name + "_scale_inv", torch.float32, shard=s_shard)   # small; never in the shared buffer
            if keep:
                return Fp8Weight(t, s, self.block, kernel=not self.on_cpu)
            return dequant_blocks(t, s, self.block, self._target(name))
        return self._raw(name, self._target(name), transient, shard)

    def _keep_dense(self, name: str) -> bool:
        # Every FP8 linear of the layers stays FP8, except kv_b_proj, which is reshaped into MLA's
        # absorbed weights (dequantized once here); embeddings / lm_head are not linear() users.
        linear_weight = name.endswith(("_proj.weight", "_proj_with_mqa.weight"))
        return (self.keep_fp8 and name.startswith("model.layers.") and linear_weight
                and not name.endswith("kv_b_proj.weight"))

    def _put(self, name: str, value) -> None:
        with self._lock:
            self.out[name] = value

    # ---- planning: one task per checkpoint tensor ----
    def _nbytes(self, name: str) -> int:
        n = self.reader.file_of(name).nbytes(name)
        shard = self._shard(name)
        if shard is not None:      # the progress bar counts what this rank keeps
            n = n * shard.size // self.reader.file_of(name).shape(name)[shard.dim]
        if self._fp8(name):
            n += self.reader.file_of(name + "_scale_inv").nbytes(name + "_scale_inv")
        return n

    def _plain_task(self, name: str) -> _Task:
        return _Task(self._nbytes(name), lambda: self._put(name, self._convert(name, self._keep_dense(name))))

    def _fused_task(self, name: str, prefix: str, which: str) -> _Task:
        keep = self.keep_fp8 and self.expert_fp8

        def run():
            t = self._convert(name, keep and self.tp_size == 1)   # TP slices the dense tensor below
            if self.expert_parallel:    # [E, ...]: this rank's whole experts
                lo, hi = self._expert_range(prefix, t.shape[0])
                t = t[lo:hi]
                if which == "down_proj":
                    self._put(prefix + ".down", t.contiguous())
                    return
                inter = t.shape[1] // 2
                self._put(prefix + ".gate", t[:, :inter].contiguous())
                self._put(prefix + ".up", t[:, inter:].contiguous())
                return
            if which == "down_proj":
                if self.tp_size > 1:    # [E, h, I]: this rank's intermediate columns
                    lo, hi = split_range(t.shape[2], self.tp_rank, self.tp_size)
                    t = t[:, :, lo:hi].contiguous()
                self._put(prefix + ".down", t)
                return
            inter = t.shape[1] // 2
            if self.tp_size > 1:        # [E, 2I, h]: this rank's rows of gate and of up
                lo, hi = split_range(inter, self.tp_rank, self.tp_size)
                self._put(prefix + ".gate", t[:, lo:hi].contiguous())
                self._put(prefix + ".up", t[:, inter + lo:inter + hi].contiguous())
                return
            if isinstance(t, Fp8Weight):
                if inter % self.block[0]:
                    t = t.dequantize(self.dtype)
                else:
                    sr = inter // self.block[0]
                    self._put(prefix + ".gate", Fp8Weight(t.weight[:, :inter].contiguous(),
                                                          t.scale_inv[:, :sr].contiguous(), self.block, t.kernel))
                    self._put(prefix + ".up", Fp8Weight(t.weight[:, inter:].contiguous(),
                                                        t.scale_inv[:, sr:].contiguous(), self.block, t.kernel))
                    return
            self._put(prefix + ".gate", t[:, :inter].contiguous())
            self._put(prefix + ".up", t[:, inter:].contiguous())
        return _Task(self._nbytes(name), run)

    def _expert_tasks(self, key: str, by_idx: dict[int, str]) -> list[_Task]:
        """Experts 0..E-1 written into one stacked device tensor, allocated before any is read."""
        n = len(by_idx)
        if sorted(by_idx) != list(range(n)):
            raise ValueError(f"{key}: expert indices are not 0..{n - 1}")
        first = by_idx[0]
        if self.expert_parallel:       # only this rank's experts, stacked from local index 0
            lo, hi = self._expert_range(key.rsplit(".", 1)[0], n)
            by_idx, n = {e - lo: by_idx[e] for e in range(lo, hi)}, hi - lo
        shape = [n] + self._shape(first)
        shard = self._shard(first)
        s_shard = scale_shard(shard, self.reader.file_of(first).shape(first), self.block)
        aligned = shard is None or s_shard is not None
        if self._fp8(first) and self.keep_fp8 and self.expert_fp8 and self._keepable(shape) and aligned:
            sname = first + "_scale_inv"
            s_shape = self.reader.file_of(sname).shape(sname)
            s_shape = s_shape if s_shard is None else s_shard.shape(s_shape)
            w = torch.empty(shape, dtype=torch.uint8, device=self.device)
            s = torch.empty([n] + s_shape, dtype=torch.float32, device=self.device)

            def run_fp8(e: int, name: str):
                w[e] = self._raw(name, transient=True, shard=shard).view(torch.uint8)
                s[e] = self._raw(name + "_scale_inv", torch.float32, shard=s_shard)
            tasks = [_Task(self._nbytes(nm), lambda e=e, nm=nm: run_fp8(e, nm)) for e, nm in by_idx.items()]
            tasks.append(_Task(0, lambda: self._put(key, Fp8Weight(w.view(torch.float8_e4m3fn), s, self.block,
                                                                   kernel=not self.on_cpu))))
            return tasks
        dst = torch.empty(shape, dtype=self.dtype, device=self.device)
        self._put(key, dst)

        def run(e: int, name: str):
            dst[e] = self._convert(name, False, transient=True)
        return [_Task(self._nbytes(nm), lambda e=e, nm=nm: run(e, nm)) for e, nm in by_idx.items()]

    def _expert_range(self, prefix: str, num_experts: int) -> tuple[int, int]:
        """This rank's routed experts of layer ``prefix`` (``...mlp.experts``); the first id is kept
        with the weights as ``<prefix>.first``, so the MoE layer maps global ids to its rows."""
        lo, hi = expert_range(num_experts, self.tp_rank, self.tp_size)
        self._put(prefix + ".first", lo)
        return lo, hi

    def plan(self) -> list[_Task]:
        tasks: list[_Task] = []
        experts: dict[str, dict[int, str]] = {}
        for name in self.reader.keys():
            m = _LAYER.match(name)
            if m and int(m.group(1)) >= self.arch.num_layers:
                continue                      # nextn / MTP layers
            if name.endswith(("_scale_inv", ".weight_scale", ".input_scale", "rotary_emb.inv_freq")):
                continue                      # scales are read with their weight
            em = _EXPERT.match(name)
            if em:
                experts.setdefault(f"{em.group(1)}.{em.group(3)}", {})[int(em.group(2))] = name
                continue
            fm = FUSED_EXPERTS.match(name)
            tasks.append(self._fused_task(name, fm.group(1), fm.group(2)) if fm else self._plain_task(name))
        for key, by_idx in experts.items():
            tasks.extend(self._expert_tasks(key, by_idx))
        return tasks

    def load(self) -> dict[str, Any]:
        from tqdm import tqdm

        tasks = self.plan()
        finals = [t for t in tasks if t.nbytes == 0]          # fp8 expert views: after their slices
        work = [t for t in tasks if t.nbytes > 0]
        total = sum(t.nbytes for t in work)
        bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="loading weights",
                   file=sys.stderr, disable=not self.progress or total < LOAD_BAR_MIN_BYTES, leave=False)

        def run(task: _Task) -> None:
            task.run()
            bar.update(task.nbytes)
        try:
            if self.threads <= 1:
                for t in work:
                    run(t)
            else:
                with ThreadPoolExecutor(self.threads, thread_name_prefix="load") as pool:
                    for fut in [pool.submit(run, t) for t in work]:
                        fut.result()
        finally:
            bar.close()
        for t in finals:
            t.run()
        return self.out


def load_weights(model_dir: str | Path, arch: ModelArch, dtype: Any, device: str, **kwargs) -> dict[str, Any]:
    return StreamingLoader(model_dir, arch, dtype, device, **kwargs).load()


def load_model(model_dir: str, dtype: Any, device: str, quantization: str = "auto", expert_fp8: bool | None = None,
               threads: int | None = None, progress: bool = True, tp=None,
               load_format: str = "auto", swa_kv_heads: int = 0) -> CausalLM | GQACausalLM:
    """Load a checkpoint folder (deepseek_v2/v3/v32: CausalLM; qwen3, ernie4_5, llama: GQACausalLM)
    onto ``device`` with weights in ``dtype``.

    ``quantization`` (config key): auto | none | fp8, see ``resolve_keep_fp8``. ``expert_fp8``
    keeps the routed experts in FP8 too; None (default): whenever FP8 is kept (the MoE layer runs
    them w8a8 on the fused kernels, or dequantizes them itself for the reference).
    ``tp`` (``paddle_mla.parallel.group.TPGroup``): load this rank's shards only.
    ``load_format`` (config key): auto reads the checkpoint; dummy makes random weights of the
    checkpoint's layout on the device from config.json alone (``paddle_mla.models.dummy_weights``;
    benchmarks only). ``swa_kv_heads``: head-wise SWA's KV heads (the last ones), which tensor
    parallelism spreads evenly over the ranks.
    """
    arch = load_arch(model_dir)
    if device == "cuda":
        # the loader's copy threads start on device 0 (the current device is per thread): name the
        # caller's device, or a tensor-parallel rank >= 1 would get its weights on GPU 0
        device = f"cuda:{torch.cuda.current_device()}"
    rank, size = (tp.rank, tp.size) if tp is not None else (0, 1)
    rows = bool(getattr(tp, "attention_rows", False))    # parallel.attention_split: rows
    if size > 1:
        local_arch(arch, size, rows)      # a clear error (heads, GQA) before any weight is read
    keep = resolve_keep_fp8(quantization, "cpu" if device == "cpu" else "gpu")
    # expert parallel: a TPGroup formed with it (parallel.expert_parallel) places routed experts whole
    kwargs = dict(keep_fp8=keep, expert_fp8=keep if expert_fp8 is None else expert_fp8, tp_rank=rank, tp_size=size,
                  expert_parallel=bool(getattr(tp, "expert_parallel", False)), swa_kv_heads=swa_kv_heads,
                  attention_rows=rows)
    if load_format == "dummy":
        from paddle_mla.models.dummy_weights import dummy_weights

        weights = dummy_weights(arch, dtype, device, **kwargs)
    elif load_format == "auto":
        reader = CheckpointReader(model_dir)
        check_checkpoint(arch, reader)     # one line naming a tensor, before any weight is read
        weights = load_weights(model_dir, arch, dtype, device, threads=threads, progress=progress and rank == 0,
                               reader=reader, **kwargs)
    else:
        raise ValueError(f"load_format must be auto or dummy, got {load_format!r}")
    if arch.family == "gqa":
        return GQACausalLM(local_arch(arch, size), weights, device, dtype, tp=tp)
    return CausalLM(local_arch(arch, size, rows), weights, device, dtype, tp=tp)
