#!/bin/sh
# One batch on the GPU machine: the AOT build, GPU tests, then the benchmark; logs under $OUT.
# Usage: sh tools/device_run.sh [pytest args...]   (BENCH_ARGS="--sections ..." picks sections;
# wheels carried in .whl/, e.g. the real-model example's, are installed first)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CODEGEN_CACHE_DIR=/tmp/cgcache
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# every dispatched module built side by side first: the tests would JIT them one at a time
python3 -m codegen build --arch native > "$OUT/build.log" 2>&1 || tail -20 "$OUT/build.log"
python3 -m pytest -q -ra -m gpu -p no:cacheprovider "$@" 2>&1 | tee "$OUT/test.log" | tail -30
[ "${BENCH_ARGS:-}" = none ] || \
  python3 -m codegen.bench --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
