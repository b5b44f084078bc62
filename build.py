#!/usr/bin/env python3
"""Build every default kernel variant for one GPU target, ahead of time.

    python build.py --arch gfx1201 [--ops group_quant_fp8,...] [--jobs N] [--out DIR] [--emu]

Writes generated/<arch>/: the sources, build.ninja, the compiled modules or assembly,
manifest.json (variants, status, resources) and dispatch.json, then prints a summary.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from codegen.targets import TARGETS, get_target, native_arch


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--arch", required=True, help=f"one of {', '.join(TARGETS)}, or native")
    ap.add_argument("--ops", help="comma-separated kernel families (default: all)")
    ap.add_argument("--jobs", type=positive_int, help="parallel compile jobs (default: ninja's)")
    ap.add_argument("--out", type=Path, help="output folder (default: generated/ beside the "
                    "package); the build goes into OUT/<arch>/")
    ap.add_argument("--emu", action="store_true",
                    help="gfx targets: also the code objects and CPU launchers the AMD ISA "
                         "emulator runs (make test-emu)")
    args = ap.parse_args(argv)

    try:
        arch = native_arch() if args.arch == "native" else args.arch
        target = get_target(arch)
    except (ValueError, RuntimeError) as e:
        print(f"build.py: {e}", file=sys.stderr)
        return 2

    from tqdm import tqdm

    from codegen.build.aot import build
    from codegen.build.store import StorageError
    from codegen.toolchain import ToolchainError

    ops = args.ops.split(",") if args.ops else None
    try:
        with tqdm(desc=f"compiling for {arch}", unit="file", file=sys.stderr) as bar:
            manifest = build(target, ops=ops, jobs=args.jobs, out_dir=args.out, progress=bar,
                             emu=args.emu)
    except (ToolchainError, ValueError, StorageError) as e:
        print(f"build.py: {e}", file=sys.stderr)
        return 2
    return summarize(manifest, args.out)


def summarize(manifest: dict, out: Path | None = None) -> int:
    rows = manifest["variants"]
    print(f"\narch {manifest['arch']}  toolchain {manifest['toolchain']}")
    by_op: dict[str, Counter] = {}
    for r in rows:
        by_op.setdefault(r["op"], Counter())[r["status"]] += 1
    print(f"{'op':<32} {'ok':>4} {'skipped':>8} {'failed':>7}  max VGPR  spills  note")
    for op, c in by_op.items():
        ok = [r for r in rows if r["op"] == op and r["status"] == "ok"]
        vg = max((r["vgpr_count"] or 0 for r in ok), default=0)
        sp = sum(r["spill_count"] or 0 for r in ok)
        reasons = {r["reason"] for r in rows if r["op"] == op and r["status"] != "ok"}
        note = "; ".join(sorted(reasons))[:120]
        print(f"{op:<32} {c['ok']:>4} {c['skipped']:>8} {c['failed']:>7}  {vg:>8}  {sp:>6}  {note}")
    print(f"manifest: {out or 'generated'}/{manifest['arch']}/manifest.json")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
