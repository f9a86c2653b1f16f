#!/usr/bin/env bash
# The CPU test suite, once per runtime (ARCHITECTURE section 2): PyTorch (with Triton kernels under
# the interpreter) and PaddlePaddle (through its torch proxy). Extra arguments go to pytest.
# Both runtimes always run; a file that fails to import is reported as an error and the rest of
# that runtime's tests still run. Ends with one result line per runtime; exits non-zero if either
# runtime failed or collected no tests (pytest exit 5). With pytest-xdist installed (the test extra),
# tests spread over one worker per core (PYTEST_WORKERS overrides; 0 runs them in this process):
# most of the suite is single-threaded Python (the Triton interpreter, tiny models).
set -uo pipefail
cd "$(dirname "$0")/.."
export PADDLE_MLA_CACHE="${PADDLE_MLA_CACHE:-$PWD/.cache}"
logdir="$(mktemp -d)"
trap 'rm -rf "$logdir"' EXIT
status=0
summary=()
workers=()
if python3 -c "import xdist" 2>/dev/null && [ "${PYTEST_WORKERS:-auto}" != 0 ]; then
  workers=(-n "${PYTEST_WORKERS:-auto}" --dist worksteal)
fi
for rt in torch paddle; do
  echo "=== runtime: $rt"
  interp=0; [ "$rt" = torch ] && interp=1
  PADDLE_MLA_RUNTIME=$rt TRITON_INTERPRET=$interp python3 -m pytest -q -p no:cacheprovider \
    --continue-on-collection-errors "${workers[@]}" "$@" 2>&1 | tee "$logdir/$rt.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) verdict=ok ;;
    5) verdict="FAILED (no tests collected)" ;;
    *) verdict="FAILED (pytest exit $rc)" ;;
  esac
  [ "$rc" -eq 0 ] || status=1
  last="$(grep -E '^(=+ )?[0-9]+ [a-z]+.* in [0-9.]+s' "$logdir/$rt.log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')"
  summary+=("$(printf '%-7s %s: %s' "$rt" "$verdict" "${last:-no pytest summary line}")")
done
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $status
