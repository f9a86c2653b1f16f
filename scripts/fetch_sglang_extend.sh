#!/usr/bin/env bash
# Fetches SGLang's Triton extend (prefill) attention kernel for benchmarks ONLY
# (benchmarks.kernels.mla_prefill). It lands in ./third_party/sglang_extend/, which .gitignore
# excludes: never commit it, never copy its code into paddle_mla. The GPU machine has no network,
# so run this here and carry third_party to the device run.
#
# Files: python/sglang/srt/layers/attention/triton_ops/{extend_attention,prefill_attention}.py of
# sglang 0.5.3; their sglang imports (is_cuda, is_hip, and extend's import of prefill_attention)
# are replaced by a shim and a local import.
set -euo pipefail
VERSION="${SGLANG_VERSION:-0.5.3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/third_party/sglang_extend"
DIR="sglang/srt/layers/attention/triton_ops"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

python3 -m pip download --quiet --no-deps "sglang==$VERSION" -d "$TMP"
(cd "$TMP" && unzip -q -o ./*.whl "$DIR/extend_attention.py" "$DIR/prefill_attention.py")
mkdir -p "$DEST"
for f in extend_attention prefill_attention; do
  sed -e 's/^from sglang\.srt\.utils import is_cuda, is_hip$/from sglang_shim import is_cuda, is_hip/' \
      -e 's/^from sglang\.srt\.layers\.attention\.triton_ops\.prefill_attention import ($/from prefill_attention import (/' \
      "$TMP/$DIR/$f.py" >"$DEST/$f.py"
  if grep -n '^from sglang\.\|^import sglang' "$DEST/$f.py"; then
    echo "unexpected sglang imports left in $f.py of sglang $VERSION" >&2; exit 1
  fi
done
cat >"$DEST/sglang_shim.py" <<'PY'
"""Stand-ins for the sglang helpers the extend kernel imports (benchmarks only, NVIDIA GPU)."""


def is_cuda() -> bool:
    return True


def is_hip() -> bool:
    return False
PY
cat >"$DEST/SOURCE.txt" <<TXT
sglang==$VERSION (PyPI wheel), files $DIR/extend_attention.py and prefill_attention.py, Apache-2.0 (SGLang Team).
Fetched by scripts/fetch_sglang_extend.sh for benchmarking only.
TXT
echo "wrote $DEST"
