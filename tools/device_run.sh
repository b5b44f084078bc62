#!/bin/sh
# One batch on the GPU machine: GPU tests, then the benchmark; logs under $OUT.
# Usage: sh tools/device_run.sh [pytest args...]
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CODEGEN_CACHE_DIR=/tmp/cgcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
python3 -m pytest -q -x -ra -m gpu "$@" tests 2>&1 | tee "$OUT/test.log" | tail -25
python3 -m codegen.bench --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
