#!/usr/bin/env bash
# The CPU test suite, once per runtime (ARCHITECTURE section 2): PyTorch (with Triton kernels under
# the interpreter) and PaddlePaddle (through its torch proxy). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
export PADDLE_MLA_CACHE="${PADDLE_MLA_CACHE:-$PWD/.cache}"
status=0
for rt in torch paddle; do
  echo "=== runtime: $rt"
  interp=0; [ "$rt" = torch ] && interp=1
  PADDLE_MLA_RUNTIME=$rt TRITON_INTERPRET=$interp python3 -m pytest -q -p no:cacheprovider "$@" || status=$?
done
exit $status
