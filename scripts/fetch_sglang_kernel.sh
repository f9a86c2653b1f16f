#!/usr/bin/env bash
# Fetches SGLang's Triton decode kernels for benchmarks ONLY: decode_attention_fwd serves MLA
# (benchmarks.kernels.mla_decode) and GQA (grouped kernel, benchmarks.kernels.gqa_attention) from one file.
# It lands in ./third_party/sglang_decode/, which .gitignore excludes: never commit it, never
# copy its code into paddle_mla. The GPU machine has no network, so run this here and carry
# third_party to the device run.
#
# The kernel is python/sglang/srt/layers/attention/triton_ops/decode_attention.py of
# sglang 0.5.3 (later releases moved it); its one sglang import (is_hip) is replaced by a shim.
set -euo pipefail
VERSION="${SGLANG_VERSION:-0.5.3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/third_party/sglang_decode"
SRC="sglang/srt/layers/attention/triton_ops/decode_attention.py"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

python3 -m pip download --quiet --no-deps "sglang==$VERSION" -d "$TMP"
(cd "$TMP" && unzip -q -o ./*.whl "$SRC")
mkdir -p "$DEST"
sed 's/^from sglang\.srt\.utils import is_hip$/from sglang_shim import is_hip/' "$TMP/$SRC" >"$DEST/decode_attention.py"
grep -q '^from sglang_shim import is_hip$' "$DEST/decode_attention.py" || {
  echo "unexpected imports in $SRC of sglang $VERSION" >&2; exit 1; }
cat >"$DEST/sglang_shim.py" <<'PY'
"""Stand-ins for the sglang helpers decode_attention.py imports (benchmarks only)."""


def is_hip() -> bool:
    return False
PY
cat >"$DEST/SOURCE.txt" <<TXT
sglang==$VERSION (PyPI wheel), file $SRC, Apache-2.0 (SGLang Team).
Fetched by scripts/fetch_sglang_kernel.sh for benchmarking only.
TXT
echo "wrote $DEST"
