"""An older tree's GEMM configs against this tree's: per-call CUDA-graph time over rotating
inputs (codegen.bench.graphs_us), each config called directly, the two trees in alternating
processes, so that clock and power drift falls on both alike.

    python tools/ab_gemm.py --old 9c9a216 [--rounds 2] CELL [CELL ...]

CELL is MxNxK:kernel:BMxBN, then any of sS (stages), kK (split-K), cC (cluster); for example
1024x24576x1536:tma:128x128:s4 or 1x7168x2048:mma:8x16:k4. The old tree is `git archive`d into
a temporary folder, or --old names a folder that holds it (where there is no git history). Each
tree JIT-builds its own configs into a cache of its own before the timing starts. Prints old
and new times (us) per round and old / new (below 1: new is slower). A worker that runs past
--timeout seconds (a kernel that hangs) is stopped: the cells it timed count, the rest show
"timed out", and the next worker runs.
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CELL = re.compile(r"(\d+)x(\d+)x(\d+):(\w+):(\d+)x(\d+)((?::[skc]\d+)*)$")


def parse_cell(cell: str) -> tuple[tuple[int, int, int], dict]:
    """(M, N, K) and the config's keyword arguments (codegen.families.gemm.config)."""
    match = _CELL.match(cell)
    if not match:
        raise ValueError(f"cell {cell!r}: expected MxNxK:kernel:BMxBN[:sS][:kK][:cC]")
    m, n, k, kernel, bm, bn, rest = match.groups()
    names = {"s": "stages", "k": "split_k", "c": "cluster"}
    kw = {names[p[0]]: int(p[1:]) for p in rest.split(":") if p}
    return (int(m), int(n), int(k)), dict(kernel=kernel, block_m=int(bm), block_n=int(bn), **kw)


def gemm_inputs(m: int, n: int, k: int, dtype):
    """Random operands of the given FP8 dtype and their 1 x 128 / 128 x 128 scales, on the GPU.
    Kept here, not taken from codegen.bench: the worker also runs in older trees."""
    import torch

    a = torch.randn(m, k, device="cuda").to(dtype)
    sa = torch.rand(m, -(-k // 128), device="cuda") + 0.5
    b = torch.randn(n, k, device="cuda").to(dtype)
    sb = torch.rand(-(-n // 128), -(-k // 128), device="cuda") + 0.5
    return a, sa, b, sb


def worker(label: str, cells: list[str]) -> None:
    """Runs inside one tree: build every cell's config side by side, then time each."""
    import torch

    from codegen.bench import graphs_us
    from codegen.families import gemm as fam
    from codegen.ops.gemm import fp8_dtype_of, gemm_with_config
    from codegen.targets import device_arch
    from codegen.tune import compile_all

    if not torch.cuda.is_available():
        sys.exit("ab_gemm: no GPU visible")
    arch = device_arch(torch.device("cuda"))
    dtype = fp8_dtype_of(arch)
    parsed = [(shape, fam.config(**kw)) for shape, kw in map(parse_cell, cells)]
    compile_all(arch, [cfg for _, cfg in parsed])
    for cell, ((m, n, k), cfg) in zip(cells, parsed):
        (us,) = graphs_us([lambda: functools.partial(gemm_with_config,
                                                      *gemm_inputs(m, n, k, dtype), cfg)],
                          m * k + n * k + 2 * m * n)
        print(f"ab {label} {cell} {us:.3f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", help="the git revision, or a folder holding its tree, to compare "
                    "against")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds one tree's worker may take (building included)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("cells", nargs="+")
    args = ap.parse_args(argv)
    for cell in args.cells:   # a bad cell fails here, before anything is built
        try:
            parse_cell(cell)
        except ValueError as e:
            ap.error(str(e))
    if args.worker:
        worker(args.worker, args.cells)
        return 0
    if not args.old:
        ap.error("--old: the revision to compare against")
    times: dict[str, dict[str, list[float]]] = {c: {"old": [], "new": []} for c in args.cells}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(args.old).resolve()
        if not old.is_dir():
            old = Path(tmp) / "old"
            old.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old, "codegen",
                                      "templates", "pyproject.toml"], capture_output=True,
                                     check=True)
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        for _ in range(args.rounds):
            for label, tree in (("old", old), ("new", ROOT)):
                env = dict(os.environ, PYTHONPATH=str(tree),
                           CODEGEN_CACHE_DIR=str(Path(tmp) / f"cache-{label}"),
                           CODEGEN_AOT_DIR=str(Path(tmp) / f"aot-{label}"))
                try:
                    run = subprocess.run([sys.executable, __file__, "--worker", label, *args.cells],
                                         env=env, capture_output=True, text=True,
                                         timeout=args.timeout)
                    out = run.stdout
                except subprocess.TimeoutExpired as e:
                    out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
                    print(f"ab_gemm: the {label} worker ran past {args.timeout:g} s; stopped",
                          file=sys.stderr)
                else:
                    if run.returncode:
                        print(run.stdout + run.stderr, file=sys.stderr)
                        return run.returncode
                for line in out.splitlines():
                    if line.startswith("ab "):
                        _, who, cell, us = line.split()
                        times[cell][who].append(float(us))
    print("| cell | old us | new us | old / new |\n|---|---|---|---|")
    for cell, t in times.items():
        old_us, new_us = (", ".join(f"{x:.1f}" for x in t[w]) or "timed out" for w in ("old", "new"))
        ratio = f"{statistics.mean(t['old']) / statistics.mean(t['new']):.3f}" \
            if t["old"] and t["new"] else "-"
        print(f"| {cell} | {old_us} | {new_us} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
