#!/usr/bin/env bash
# CI compile check of the CUDA kernels: every custom_ops/*.cu must compile with nvcc ALONE (no
# framework headers, no GPU needed), so the kernels stay framework-neutral (docs/architecture.md);
# so must the standalone probes in benchmarks/profile/*.cu, which include the kernels' headers.
# The op build itself takes the C++ standard from the framework (Paddle: C++17; torch >= 2.14:
# C++20), so the sources are checked under both; sm_90a is the Hopper target the MLA decode op is
# written for. The compiles run one per core (CI's time is the suite's budget too).
# Usage: scripts/check_cuda_compile.sh [arch, default sm_90a]
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-sm_90a}"
nvcc="$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")"
[ -x "$nvcc" ] || { echo "check_cuda_compile: nvcc not found" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export nvcc arch out
compile_one() {   # "STD SRC": one nvcc compile, or the plain-C++ check of a CPU header
  local std="$1" src="$2" tag how=c++
  tag="$(basename "$src").$std"
  if [[ "$src" == *.cu ]]; then
    how="$arch"
    "$nvcc" -c -std="$std" -O3 -arch="$arch" -Werror all-warnings -Icustom_ops "$src" -o "$out/$tag.o" \
      >"$out/$tag.log" 2>&1 && echo "ok    $src ($how, $std)" && return 0
  else
    echo "#include \"$(basename "$src")\"" | c++ -std="$std" -Wall -Wextra -Werror -fsyntax-only -Icustom_ops -x c++ - \
      >"$out/$tag.log" 2>&1 && echo "ok    $src ($how, $std)" && return 0
  fi
  echo "FAIL  $src ($how, $std)" >&2
  cat "$out/$tag.log" >&2
  return 1
}
export -f compile_one
jobs=()
for std in c++17 c++20; do
  for src in custom_ops/*.cu benchmarks/profile/*.cu custom_ops/metadata_cpu.h custom_ops/append_attention_cpu.h custom_ops/mla_decode_cuda.h custom_ops/mla_sparse_cuda.h; do
    jobs+=("$std $src")
  done
done
printf '%s\n' "${jobs[@]}" | xargs -P "$(nproc)" -L 1 bash -c 'compile_one "$0" "$1"'
