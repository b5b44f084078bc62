PY ?= python3
ARCH ?= gfx1201
JOBS ?=

.PHONY: setup build test bench clean

setup:
	@PY=$(PY) sh tools/setup.sh

build: setup
	$(PY) build.py --arch $(ARCH) $(if $(JOBS),--jobs $(JOBS))

test: setup
	$(PY) -m pytest -q -ra tests

bench: setup
	$(PY) -m codegen.bench

clean:
	rm -rf generated/*/
