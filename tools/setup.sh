#!/bin/sh
# Install what `make build` / `make test` need, only where it is missing: a machine that already
# has everything (such as an offline GPU machine) installs nothing.
set -u
PY=${PY:-python3}

if ! $PY -c "import jinja2, ninja, filelock, tqdm, pytest, numpy" 2>/dev/null; then
  $PY -m pip install -q "jinja2>=3.1" "ninja>=1.11" "filelock>=3.12" "tqdm>=4.66" "pytest>=8" \
    "numpy>=1.24" || exit 1
fi
if ! $PY -c "import torch" 2>/dev/null; then
  # CPU machines: a CPU build is enough for everything but the GPU tests.
  $PY -m pip install -q "torch==2.13.0" || exit 1
fi
if ! $PY -c "import triton" 2>/dev/null; then
  $PY -m pip install -q "triton>=3.0" || echo "setup: triton (HIP headers) not installed; AMD ISA checks will be skipped"
fi
if ! command -v clang-22 >/dev/null 2>&1 || ! command -v ld.lld-22 >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-22 lld-22) >/dev/null 2>&1 \
      || echo "setup: clang-22 / lld-22 not installed; AMD ISA checks will be skipped"
  fi
fi
exit 0
