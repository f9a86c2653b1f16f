"""FlashInfer's MLA decode (``BatchMLAPagedAttentionWrapper``) as a same-process anchor of the MLA
decode benchmark. Benchmarks only: FlashInfer is never a dependency of paddle_mla.

``scripts/fetch_flashinfer.sh`` puts a trimmed copy of the ``flashinfer-python`` wheel (the MLA
kernels' sources and headers, without the folders of unrelated kernels, so that it travels to the GPU
machine within a device call's size limit) and the ``apache-tvm-ffi`` wheel it JIT-builds with into
the git-ignored ``third_party/flashinfer/``. ``load`` imports an installed ``flashinfer`` if there is
one, else unpacks those into a temporary folder and imports its packages from there through a finder
that knows those packages alone (sys.path is untouched). FlashInfer JIT-compiles the
kernel on first use (nvcc, a minute or two).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from benchmarks.harness.anchors import THIRD_PARTY

FOLDER = THIRD_PARTY / "flashinfer"
FETCH = "scripts/fetch_flashinfer.sh"
WORKSPACE_BYTES = 128 * 2**20   # FlashInfer's suggested float workspace


def _unpack() -> Path:
    """The fetched files unpacked once per machine: the site folder to import from."""
    tars = sorted(FOLDER.glob("*.tar.xz"))   # one folder per fetched version: a new fetch never reuses an old copy
    site = Path(tempfile.gettempdir()) / f"paddle_mla_{tars[-1].name.removesuffix('.tar.xz')}"
    done = site / ".unpacked"
    if not done.exists():
        site.mkdir(parents=True, exist_ok=True)
        for tar in tars:
            with tarfile.open(tar) as t:
                t.extractall(site, filter="data")
        for whl in FOLDER.glob("*.whl"):
            with zipfile.ZipFile(whl) as z:
                z.extractall(site)
        done.touch()
    return site


class _SiteFinder(importlib.abc.MetaPathFinder):
    """Finds the top-level packages of the unpacked folder (flashinfer, tvm_ffi) by name, and nothing
    else; their submodules come through the packages' own paths. It stays installed: FlashInfer
    imports tvm_ffi lazily, at its JIT build."""

    def __init__(self, site: Path):
        self.site = site
        self.names = {p.name for p in site.iterdir() if (p / "__init__.py").exists()}

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        return importlib.machinery.PathFinder.find_spec(name, [str(self.site)])


def load():
    """(the flashinfer module, its version and origin) or (None, why not)."""
    try:
        fi = importlib.import_module("flashinfer")   # an installed copy wins
    except ImportError:
        if not any(FOLDER.glob("*.tar.xz")):
            return None, f"missing (run {FETCH})"
        sys.meta_path.append(_SiteFinder(_unpack()))
        try:
            fi = importlib.import_module("flashinfer")
        except Exception as e:  # noqa: BLE001  (reported in the table, not fatal)
            return None, f"import failed: {e!r}"[:300]
    return fi, f"flashinfer-python {fi.__version__} ({os.path.dirname(fi.__file__)})"


class FlashInferMla:
    """FlashInfer's paged MLA decode on one benchmark case: one query token a row, the latent cache's
    512 + 64 columns as FlashInfer's ckv / kpe caches (copied once, so both read packed pages), the
    case's block tables as its page lists. ``backend``: "fa3" (its Hopper kernel) or "auto"."""

    def __init__(self, fi, case, h: int, sm_scale: float, backend: str = "fa3"):
        import torch

        cache, tables, q, lens = case
        b, pages = tables.shape
        page = cache.shape[1]
        dev = q.device
        i32 = dict(dtype=torch.int32, device=dev)
        self.ckv = cache[:, :, 0, :512].contiguous()
        self.kpe = cache[:, :, 0, 512:].contiguous()
        self.q_nope = q[..., :512].contiguous()
        self.q_pe = q[..., 512:].contiguous()
        self.out = torch.empty(b, h, 512, dtype=torch.bfloat16, device=dev)
        qo_indptr = torch.arange(b + 1, **i32)
        kv_indptr = torch.arange(b + 1, **i32) * pages
        kv_indices = tables.reshape(-1).contiguous()
        kv_lens = lens.to(torch.int32)
        self.bufs = [torch.empty_like(x) for x in (qo_indptr, kv_indptr, kv_indices, kv_lens)]
        ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        self.wrapper = fi.mla.BatchMLAPagedAttentionWrapper(
            ws, use_cuda_graph=True, qo_indptr=self.bufs[0], kv_indptr=self.bufs[1], kv_indices=self.bufs[2],
            kv_len_arr=self.bufs[3], backend=backend)
        self.wrapper.plan(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_lens,
                          num_heads=h, head_dim_ckv=512, head_dim_kpe=64, page_size=page, causal=False,
                          sm_scale=sm_scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        self.backend = getattr(self.wrapper, "_planned_backend_name", None) or backend

    def run(self):
        return self.wrapper.run(self.q_nope, self.q_pe, self.ckv, self.kpe, out=self.out)
