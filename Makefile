PY ?= python3
ARCH ?= gfx1201
JOBS ?=

EMULATOR ?= .emulator/tinygrad

.PHONY: setup build test emu-env test-emu test-emu-sweep emulator bench clean

setup:
	@PY=$(PY) sh tools/setup.sh

build: setup
	$(PY) build.py --arch $(ARCH) $(if $(JOBS),--jobs $(JOBS))

test: setup
	$(PY) -m pytest -q -ra tests

# L4: the gfx code objects in the AMD ISA emulator (tools/get_emulator.sh puts it in EMULATOR);
# the emulator compiles each instruction with an executable named `clang`.
EMU_PYTEST = PATH="$(CURDIR)/.emulator/bin:$$PATH" CODEGEN_AMD_EMULATOR=$(EMULATOR) \
	  $(PY) -m pytest -q -ra tests/test_emu.py

emu-env: setup
	@[ -f "$(EMULATOR)/test/mockgpu/amd/emu.py" ] || DEST="$(EMULATOR)" sh tools/get_emulator.sh $(TINYGRAD_GIT)
	@$(PY) -c "import msgpack" 2>/dev/null || $(PY) -m pip install -q "msgpack>=1.0"
	@mkdir -p .emulator/bin && ln -sf "$$(command -v clang-22)" .emulator/bin/clang

test-emu: emu-env
	$(EMU_PYTEST) -m "emu and not emu_sweep"

# every GEMM config `python -m codegen.tune` may time on an AMD GPU, once each (about 20 min)
test-emu-sweep: emu-env
	$(EMU_PYTEST) -m emu_sweep

emulator:
	@sh tools/get_emulator.sh $(TINYGRAD_GIT)

bench: setup
	$(PY) -m codegen.bench --json docs/bench/
	-$(PY) -m codegen.bench_report

clean:
	rm -rf generated/*/
