#!/usr/bin/env python3
"""Build every default kernel variant for one GPU target, ahead of time.

    python build.py --arch gfx1201 [--ops group_quant_fp8,...] [--jobs N] [--out DIR] [--emu]
                    [--wheel [DIR]]

The same as `python -m codegen build ...`: writes <out>/<arch>/ (generated/ in this checkout):
the sources, build.ninja, the compiled modules or assembly, manifest.json (variants, status,
resources) and dispatch.json, then prints a summary.
"""
import sys

from codegen.cli import main

if __name__ == "__main__":
    sys.exit(main(["build", *sys.argv[1:]]))
