#!/usr/bin/env bash
# Fetches SGLang's Triton fused MoE kernel for benchmarks ONLY (benchmarks.kernels.fused_moe).
# It lands in ./third_party/sglang_fused_moe/, which .gitignore excludes: never commit it, never
# copy its code into paddle_mla. The GPU machine has no network, so run this here and carry
# third_party to the device run.
#
# Files: fused_moe_triton_kernels.py (fused_moe_kernel, invoke_fused_moe_kernel, moe_sum_reduce_triton),
# fused_moe_triton_config.py and SGLang's tuned JSON configs, from python/sglang/srt/layers/moe/
# fused_moe_triton/ of sglang 0.5.3. Their sglang imports (quantization kernels, utils, the
# override config) are replaced by ./sglang_shim.py; align and silu_and_mul (sgl_kernel CUDA ops)
# are not fetched: the benchmark feeds SGLang's GEMMs the same aligned ids as ours.
set -euo pipefail
VERSION="${SGLANG_VERSION:-0.5.3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/third_party/sglang_fused_moe"
SRC="sglang/srt/layers/moe/fused_moe_triton"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

python3 -m pip download --quiet --no-deps "sglang==$VERSION" -d "$TMP"
(cd "$TMP" && unzip -q -o ./*.whl "$SRC/fused_moe_triton_kernels.py" "$SRC/fused_moe_triton_config.py" "$SRC/configs/*")
rm -rf "$DEST" && mkdir -p "$DEST"
cp -r "$TMP/$SRC/configs" "$DEST/configs"
python3 - "$TMP/$SRC" "$DEST" <<'PY'
import re
import sys
from pathlib import Path

src, dest = Path(sys.argv[1]), Path(sys.argv[2])
# multi-line "from sglang... import (...)" blocks and one-line sglang imports -> the shim
block = re.compile(r"^from sglang\.[\w.]+ import \((?:[^)]*)\)\n", re.M)
line = re.compile(r"^(\s*)from sglang\.[\w.]+ import ([\w, ]+)$", re.M)
for name in ("fused_moe_triton_kernels.py", "fused_moe_triton_config.py"):
    text = (src / name).read_text()
    text, n_block = block.subn(lambda m: "from sglang_shim import " + " ".join(
        m.group(0).split("(", 1)[1].split(")", 1)[0].split()).rstrip(",") + "\n", text)
    text, n_line = line.subn(lambda m: f"{m.group(1)}from sglang_shim import {m.group(2)}", text)
    if "sglang." in text.replace("sglang_shim", ""):
        left = [l for l in text.splitlines() if "sglang." in l and "sglang_shim" not in l and "import" in l]
        if left:
            sys.exit(f"unexpected sglang imports left in {name}: {left}")
    (dest / name).write_text(text)
    print(f"{name}: {n_block} import blocks and {n_line} import lines redirected to sglang_shim")
PY
cat >"$DEST/sglang_shim.py" <<'PY'
"""Stand-ins for the sglang helpers the fused MoE kernel files import (benchmarks only).

The activation quantizer is the one the benchmark also gives paddle_mla's fused MoE
(``set_act_quant``), so both sides pay the same quantization cost."""

import os

import torch

_act_quant = None


def set_act_quant(fn) -> None:
    global _act_quant
    _act_quant = fn


def _quant(x, group, *args, **kwargs):
    if _act_quant is None:
        raise RuntimeError("sglang_shim: call set_act_quant(fn) first")
    return _act_quant(x, group)


per_token_group_quant_fp8 = sglang_per_token_group_quant_fp8 = _quant


def _unsupported(*args, **kwargs):
    raise NotImplementedError("not part of the paddle_mla benchmark (sglang_shim)")


scaled_fp8_quant = per_token_group_quant_int8 = per_token_quant_int8 = sglang_per_token_group_quant_int8 = _unsupported


def is_hip() -> bool:
    return False


def is_cuda() -> bool:
    return torch.cuda.is_available()


def is_cpu() -> bool:
    return False


def cpu_has_amx_support() -> bool:
    return False


def get_bool_env_var(name: str, default: str = "false") -> bool:
    return os.environ.get(name, default).lower() in ("1", "true")


def get_device_name(device_id: int = 0) -> str:
    return torch.cuda.get_device_name(device_id) if torch.cuda.is_available() else "cpu"


def get_config():
    return None
PY
cat >"$DEST/SOURCE.txt" <<TXT
sglang==$VERSION (PyPI wheel), files $SRC/{fused_moe_triton_kernels.py,fused_moe_triton_config.py,configs/},
Apache-2.0 (SGLang Team). Fetched by scripts/fetch_sglang_fused_moe.sh for benchmarking only.
TXT
echo "wrote $DEST"
