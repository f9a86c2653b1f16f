#!/usr/bin/env bash
export PATH=$(python3 -c 'import sys,os;print(os.path.dirname(sys.executable))'):$PATH
SHARDS=8 LIMIT=380 OUT=$OUT bash scripts/gpu_tests.sh > $OUT/all.txt 2>&1
echo "rc=$?"
grep -E "passed|failed|error" $OUT/gpu_tests.txt | tail -n 25
grep -E "^(FAILED|ERROR)" $OUT/gpu_tests_full.txt | head -n 30
