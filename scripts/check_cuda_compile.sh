#!/usr/bin/env bash
# CI compile check of the CUDA kernels: every custom_ops/*.cu must compile with nvcc ALONE (no
# framework headers, no GPU needed), so the kernels stay framework-neutral (ARCHITECTURE section 3).
# The op build itself takes the C++ standard from the framework (Paddle: C++17; torch >= 2.14:
# C++20), so the sources are checked under both.
# Usage: scripts/check_cuda_compile.sh [arch, default sm_90]
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-sm_90}"
nvcc="$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")"
[ -x "$nvcc" ] || { echo "check_cuda_compile: nvcc not found" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
status=0
for std in c++17 c++20; do
  for src in custom_ops/*.cu; do
    if "$nvcc" -c -std=$std -O3 -arch="$arch" -Werror all-warnings -Icustom_ops "$src" -o "$out/$(basename "$src").o"; then
      echo "ok    $src ($arch, $std)"
    else
      echo "FAIL  $src ($arch, $std)" >&2
      status=1
    fi
  done
  # The CPU headers must stay plain C++ too (the CUDA kernels share their per-element helpers).
  for hdr in metadata_cpu.h append_attention_cpu.h mla_decode_cuda.h; do
    if echo "#include \"$hdr\"" | c++ -std=$std -Wall -Wextra -Werror -fsyntax-only -Icustom_ops -x c++ -; then
      echo "ok    custom_ops/$hdr (c++, $std)"
    else
      echo "FAIL  custom_ops/$hdr (c++, $std)" >&2
      status=1
    fi
  done
done
exit $status
