"""The anchors the kernel benchmarks compare against: SGLang's Triton kernels, fetched by
scripts/fetch_sglang_*.sh into the git-ignored ./third_party/<folder> (benchmarks only; never
copied into paddle_mla). A folder's files import each other by bare name (``from sglang_shim import
...``), so they load through a finder that knows that folder's files only: sys.path is untouched and
nothing else can shadow or be shadowed by them."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

THIRD_PARTY = Path(__file__).resolve().parents[2] / "third_party"


@dataclass(frozen=True)
class Anchor:
    folder: str          # under ./third_party
    module: str          # the file (without .py) that holds the entry point
    entry: str           # its function, or "" for the module itself
    fetch_script: str    # what fills the folder

    @property
    def path(self) -> Path:
        return THIRD_PARTY / self.folder


SGLANG_DECODE = Anchor("sglang_decode", "decode_attention", "decode_attention_fwd", "scripts/fetch_sglang_kernel.sh")
SGLANG_EXTEND = Anchor("sglang_extend", "extend_attention", "extend_attention_fwd", "scripts/fetch_sglang_extend.sh")
SGLANG_FUSED_MOE = Anchor("sglang_fused_moe", "fused_moe_triton_kernels", "", "scripts/fetch_sglang_fused_moe.sh")


class _FolderFinder(importlib.abc.MetaPathFinder):
    """Finds the top-level modules of one third_party folder by their bare names, and nothing else."""

    def __init__(self, folder: Path):
        self.files = {p.stem: p for p in folder.glob("*.py")}

    def find_spec(self, name, path=None, target=None):
        file = self.files.get(name)
        return importlib.util.spec_from_file_location(name, file) if file is not None else None


def import_from(anchor: Anchor, module: str):
    """Module ``module`` of the anchor's folder (its bare-name imports resolved within the folder)."""
    finder = _FolderFinder(anchor.path)
    for name, file in finder.files.items():   # another folder's module of the same name (each has a sglang_shim)
        loaded = getattr(sys.modules.get(name), "__file__", None)
        if loaded is not None and Path(loaded).resolve() != file.resolve():
            del sys.modules[name]
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module(module)
    finally:
        sys.meta_path.remove(finder)


def load(anchor: Anchor):
    """(entry point, the folder's SOURCE.txt text), or (None, why) when the folder is missing or does
    not import: a benchmark reports that in its table and goes on without the anchor."""
    if not (anchor.path / f"{anchor.module}.py").exists():
        return None, f"missing (run {anchor.fetch_script})"
    try:
        mod = import_from(anchor, anchor.module)
    except Exception as e:  # noqa: BLE001  (reported in the table, not fatal)
        return None, f"import failed: {e!r}"
    source = (anchor.path / "SOURCE.txt").read_text().strip()
    return (getattr(mod, anchor.entry) if anchor.entry else mod), source
