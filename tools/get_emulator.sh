#!/bin/sh
# Unpack the AMD ISA emulator (tinygrad's mock AMD GPU) at the commit the emu tests are written
# against into .emulator/tinygrad (git-ignored). Usage: sh tools/get_emulator.sh [TINYGRAD_GIT_DIR]
# Without an argument it clones https://github.com/tinygrad/tinygrad (network needed).
set -eu
COMMIT=a9069c177a9da9cca18593edf55acd2e6073cca6
DEST=${DEST:-.emulator/tinygrad}
SRC=${1:-}
if [ -f "$DEST/test/mockgpu/amd/emu.py" ]; then echo "emulator: $DEST"; exit 0; fi
if [ -z "$SRC" ]; then
  SRC=.emulator/tinygrad.git
  [ -d "$SRC" ] || git clone --bare --filter=blob:none https://github.com/tinygrad/tinygrad "$SRC"
fi
mkdir -p "$DEST"
git -C "$SRC" archive "$COMMIT" tinygrad test/__init__.py test/amd/__init__.py test/amd/helpers.py \
  test/mockgpu extra/hip_gpu_driver LICENSE | tar -x -C "$DEST"
echo "emulator: $DEST (tinygrad $COMMIT)"
