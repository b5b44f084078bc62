"""Where a tma GEMM grid's time goes between back-to-back calls: per-CTA timestamps (the GPU's
global timer) of 64 calls in a row, read against the end of the call before. Instruments a
copy of this tree's tma template in a temporary folder; the checkout is not touched.

    python tools/trace_tma.py 1024x4096x7168:tma:128x128:s6 [--trigger 0,1] [--map 1,5,smid]

--trigger: 1 lets the next grid launch at this one's start, 0 at its end (default: the
launcher's rule). --map: which CTA takes which tiles: CTA i takes unit (i * N) % grid (N coprime
with the grid; 1, the default, is the kernel's own), or the unit of its SM's number (smid).
Each takes a list: every pair is timed in one process, one build. Columns (us, p10 / p50 /
p90 over the calls): period (last CTA end to last CTA end), land (a CTA's first instruction;
below 0: it landed before the call before ended), early (CTAs landed before it), go_first /
go_last (past the wait for the call before), first_end (first CTA's end after go_first),
last_round (last CTA end after the median start of the CTAs' last tiles), tail (last end after
the 10th percentile end). --save FILE.npz keeps each pair's raw timestamps (calls x CTAs x
smid, land, go, last tile, end; ns) for a closer look, under trigger<T>_map<N> (a repeated
pair adds _1, _2, ...).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_gemm import ROOT, gemm_inputs, parse_cell  # noqa: E402

TEMPLATE = "templates/gemm_a8w8_blockscale_tma.cu.j2"
# (found, replaced by): each must occur exactly once in the template
PATCH = [
    ("#include <algorithm>\n", "#include <algorithm>\n#include <cstdlib>\n#include <numeric>\n"),
    ("namespace {\n\n", """namespace {
__device__ unsigned long long g_trace[64][264][5];   // call, CTA: smid, land, go, last tile, end
CG_DEVICE unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
CG_DEVICE unsigned sm_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %smid;" : "=r"(r));
  return r;
}

"""),
    ("    int trigger_early) {", "    int trigger_early, int call, int map) {"),
    ("  extern __shared__ uint8_t smem_raw[];",
     "  const unsigned long long landed = now_ns();\n  extern __shared__ uint8_t smem_raw[];"),
    ("first = blockIdx.x / CLUSTER, step = gridDim.x / CLUSTER;",
     "step = gridDim.x / CLUSTER, first = map < 0 ? int(sm_id() % unsigned(step)) : "
     "int(blockIdx.x / CLUSTER * unsigned(map ? map : 1) % unsigned(step));"),
    ("  cg::pdl_wait();   // before any global memory access; the barriers are set up before it\n",
     """  cg::pdl_wait();   // before any global memory access; the barriers are set up before it
  if (threadIdx.x == 0) {
    g_trace[call][blockIdx.x][0] = sm_id();
    g_trace[call][blockIdx.x][1] = landed;
    g_trace[call][blockIdx.x][2] = now_ns();
  }
"""),
    ("""    tile_origin(t, units_m, tiles_n, rank, m0, n0);
    // this thread's accumulator rows""", """    tile_origin(t, units_m, tiles_n, rank, m0, n0);
    if (tid == 128) g_trace[call][blockIdx.x][3] = now_ns();
    // this thread's accumulator rows"""),
    ("""  if (tma_out && warp == 0 && lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
""", """  if (tma_out && warp == 0 && lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  if (tid == 128) g_trace[call][blockIdx.x][4] = now_ns();
"""),
    ("  const int trigger_early = units <= busy || kblocks <= 8;\n",
     """  int trigger_early = units <= busy || kblocks <= 8;
  if (const char* e = getenv("TRACE_TRIGGER")) trigger_early = atoi(e);
  const int map = getenv("TRACE_MAP") ? atoi(getenv("TRACE_MAP")) : 0;
  // a permutation of the units; by SM number only without clusters (a cluster's CTAs share one)
  if ((map > 0 && std::gcd(int64_t(map), busy) != 1) || (map < 0 && CLUSTER > 1))
    return int(cudaErrorInvalidValue);
  static int call = 0;
  call = (call + 1) % 64;
"""),
    ("      int(split), trigger_early);", "      int(split), trigger_early, call, map);"),
]
DUMP = """
extern "C" int trace_dump(void* host) {
  return int(cudaMemcpyFromSymbol(host, g_trace, sizeof(g_trace)));
}
"""


def instrumented_tree(dst: Path) -> Path:
    """A copy of this tree's package and templates with the tma template instrumented."""
    for name in ("codegen", "templates"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst)
    path = dst / TEMPLATE
    text = path.read_text()
    for found, new in PATCH:
        if text.count(found) != 1:
            raise SystemExit(f"trace_tma: the template changed; found {text.count(found)} times:"
                             f"\n{found}")
        text = text.replace(found, new)
    path.write_text(text + DUMP)
    return dst


def worker(cell: str, triggers: list[str], maps: list[str], save: str) -> None:
    """Runs in the instrumented tree: per (trigger, map), 70 calls to warm up, 64 traced, the
    table. The launcher reads both from the environment at each call."""
    import torch

    from codegen.bench import cache_bytes
    from codegen.families import gemm as fam
    from codegen.ops.gemm import fp8_dtype_of
    from codegen.targets import device_arch

    (m, n, k), kw = parse_cell(cell)
    cfg = fam.config(**kw)
    dtype = fp8_dtype_of(device_arch(torch.device("cuda")))
    # operands rotating past 2x the device's last cache, up to 8 sets
    sets = [gemm_inputs(m, n, k, dtype) for _ in range(max(1, min(8, 2 * cache_bytes() // (
        m * k + n * k + 2 * m * n) + 1)))]
    raw, seen = {}, {}
    for trigger in triggers:
        for mapping in maps:
            if trigger:
                os.environ["TRACE_TRIGGER"] = trigger
            os.environ["TRACE_MAP"] = "-1" if mapping == "smid" else mapping
            print(f"\n{cell}, launch point {trigger or 'the rule'}, map {mapping}:")
            key = f"trigger{trigger or 'rule'}_map{mapping}"
            seen[key] = seen.get(key, -1) + 1
            raw[key + (f"_{seen[key]}" if seen[key] else "")] = _trace(cfg, sets)
    if save:
        import numpy as np
        np.savez_compressed(save, **raw)


def _trace(cfg: dict, sets: list):
    import ctypes

    import numpy as np
    import torch

    from codegen import dispatch
    from codegen.ops.gemm import _launcher, gemm_with_config

    for i in range(70):
        gemm_with_config(*sets[i % len(sets)], cfg)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)   # the 64 calls queue up behind it and then run back to back
    for i in range(64):
        gemm_with_config(*sets[i % len(sets)], cfg)
    torch.cuda.synchronize()
    _, uri = _launcher(sets[0][0], cfg)
    lib = dispatch._load(next(v for v in dispatch._loaded if v.uri == uri))
    buf = np.zeros((64, 264, 5), dtype=np.uint64)
    if lib.trace_dump(ctypes.c_void_p(buf.ctypes.data)):
        raise SystemExit("trace_tma: reading the trace failed")
    grids = sorted((g[g[:, 1] > 0].astype(np.int64) for g in buf if (g[:, 1] > 0).any()),
                   key=lambda g: g[:, 1].min())
    cols = {"period": [], "land": [], "early": [], "go_first": [], "go_last": [],
            "first_end": [], "last_round": [], "tail": []}
    for prev, g in zip(grids[1:-1], grids[2:]):   # the first may follow an untraced call
        end = prev[:, 4].max()
        row = ((g[:, 4].max() - end) / 1e3, (g[:, 1].min() - end) / 1e3,
               int((g[:, 1] < end).sum()), (g[:, 2].min() - end) / 1e3,
               (g[:, 2].max() - end) / 1e3, (g[:, 4].min() - g[:, 2].min()) / 1e3,
               (g[:, 4].max() - np.median(g[:, 3])) / 1e3,
               (g[:, 4].max() - np.percentile(g[:, 4], 10)) / 1e3)
        for name, x in zip(cols, row):
            cols[name].append(x)
    same = np.mean([np.array_equal(a[:, 0], b[:, 0]) for a, b in zip(grids, grids[1:])])
    print(f"{len(grids)} calls of {len(grids[0])} CTAs; the SM of each CTA as the call before's "
          f"in {same:.0%} of calls; SMs by CTA in one call: {grids[1][:, 0].tolist()}")
    print("| | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for q in (10, 50, 90):
        print(f"| p{q} | " + " | ".join(f"{np.percentile(v, q):.2f}" for v in cols.values())
              + " |")
    return np.stack(grids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trigger", default="", help="0, 1 or both (0,1)")
    ap.add_argument("--map", default="1", help="multipliers N coprime with the grid, or smid")
    ap.add_argument("--save", default="", help="FILE.npz for the raw timestamps")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("cell")
    args = ap.parse_args(argv)
    try:
        _, kw = parse_cell(args.cell)
    except ValueError as e:
        ap.error(str(e))
    if kw["kernel"] != "tma":
        ap.error(f"cell {args.cell!r}: only the tma kernel is instrumented")
    triggers, maps = args.trigger.split(","), args.map.split(",")
    if any(t not in ("", "0", "1") for t in triggers) or (len(triggers) > 1 and "" in triggers):
        ap.error(f"--trigger {args.trigger!r}: expected 0, 1 or 0,1")
    if any(m != "smid" and not (m.isdigit() and int(m) > 0) for m in maps):
        ap.error(f"--map {args.map!r}: expected positive integers or smid")
    if args.worker:
        worker(args.cell, triggers, maps, args.save)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = instrumented_tree(Path(tmp) / "tree")
        env = dict(os.environ, PYTHONPATH=str(tree), CODEGEN_CACHE_DIR=str(Path(tmp) / "cache"),
                   CODEGEN_AOT_DIR=str(Path(tmp) / "aot"))
        return subprocess.run([sys.executable, __file__, "--worker", "--trigger", args.trigger,
                               "--map", args.map, "--save", str(Path(args.save).resolve()) if args.save
                               else "", args.cell], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
