#!/usr/bin/env bash
# Fetches FlashInfer for benchmarks ONLY: its MLA decode (BatchMLAPagedAttentionWrapper) is the
# same-process anchor of benchmarks.kernels.mla_decode (benchmarks/harness/flashinfer_mla.py). It
# lands in ./third_party/flashinfer/, which .gitignore excludes: never commit it, never copy its
# code into paddle_mla. The GPU machine has no network, so run this here and carry third_party.
#
# The flashinfer-python wheel is about 62 MB, most of it the sources of kernels the MLA decode
# never builds; a device call carries at most 64 MiB. So the wheel is trimmed into a tarball
# (about 11 MB): csrc keeps its top-level files (the MLA kernels' .cu among them) and drops its
# subfolders, CUTLASS keeps its headers, and moe_ep's kernel sources go. FlashInfer JIT-builds its
# MLA module with apache-tvm-ffi, fetched as a wheel for the GPU machine's Python (PYVER, 3.12).
# Its other requirements are either on that machine or not imported by the MLA path.
set -euo pipefail
VERSION="${FLASHINFER_VERSION:-0.7.2.post1}"
TVM_FFI="${TVM_FFI_VERSION:-0.1.15.post2}"
PYVER="${PYVER:-3.12}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/third_party/flashinfer"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$TMP" "flashinfer-python==$VERSION"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$TMP" "apache-tvm-ffi==$TVM_FFI"
(cd "$TMP" && mkdir site && unzip -q flashinfer_python-*.whl 'flashinfer/*' -d site)
fi_dir="$TMP/site/flashinfer"
find "$fi_dir/data/csrc" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
rm -rf "$fi_dir/moe_ep/kernel_src"
for d in examples test media docs python tools/library tools/profiler; do rm -rf "$fi_dir/data/cutlass/$d"; done
find "$fi_dir" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$DEST"
mkdir -p "$DEST"
tar -C "$TMP/site" -cJf "$DEST/flashinfer-$VERSION-mla.tar.xz" flashinfer
cp "$TMP"/apache_tvm_ffi-*.whl "$DEST/"
cat >"$DEST/SOURCE.txt" <<TXT
flashinfer-python==$VERSION (PyPI wheel, trimmed to what its MLA decode builds from) and
apache-tvm-ffi==$TVM_FFI (cp${PYVER/./}, manylinux), Apache-2.0 (FlashInfer team; Apache TVM).
Fetched by scripts/fetch_flashinfer.sh for benchmarking only.
TXT
du -sh "$DEST"/*
echo "wrote $DEST"
