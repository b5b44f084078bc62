"""Tune the GEMM dispatch table on the present GPU: `python -m codegen.tune [--quick]`.

Times every valid candidate config for each (M bucket, N, K) the way `make bench` does (per-call
time in a CUDA graph of back-to-back calls over input sets larger than 2x the last cache, the
sets shared by the candidates of a cell), times the few within 5% of the fastest again in turn,
and writes the fastest of that round to codegen/tables/gemm_a8w8_blockscale.<arch>.json (or
--out), the table that dispatch and the build read. Candidates are compiled in parallel first;
on AMD each cell times them best-first by the static K-loop estimate (codegen/build/estimate.py),
`--top N` only the first N.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from . import reference
from .bench import a_scales_as, graph_us, graphs_us, input_sets
from .build import module_path, store
from .families import gemm as fam
from .spec import Variant, make_variant, validate
from .targets import get_target, native_arch

MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
NEAR, FINALISTS = 1.05, 4   # a cell's configs timed again, in turn: within 5% of the fastest


def finalists(timed: list[tuple]) -> list[tuple]:
    """The (us, config, rank) entries of a cell's sweep worth a second, in-turn timing: the
    fastest FINALISTS within NEAR of the fastest, fastest first."""
    timed = sorted(timed, key=lambda t: t[0])
    return [t for t in timed if t[0] <= timed[0][0] * NEAR][:FINALISTS] if timed else []


def candidates(arch: str) -> list[dict]:
    c = fam.config
    # one or two K blocks of fragments in registers (stages); the second where it fits
    # (split_k 14 gives each wave 4 of K = 7168's 56 K blocks, where 16 leaves half with 3)
    cands = [c("mma", bm, bn, split_k=sk, stages=s) for bm in (8, 16, 32, 64)
             for bn in (16, 32, 64) for sk in (1, 4, 8, 14, 16) for s in (1, 2)]
    # decode: a tile's K blocks split over a cluster of blocks too (short, many blocks)
    cands += [c("mma", bm, bn, split_k=sk, stages=s, cluster=cl) for bm in (8, 16)
              for bn in (16, 32, 64) for sk in (4, 8, 16) for s in (1, 2) for cl in (2, 4, 8)]
    # decode: the same with the block's first pass over its weights started into L2 early
    cands += [{**cfg, "l2_first_pass": True} for cfg in cands if cfg["block_m"] <= 16]
    cands += [c("gemv", bm, bn, split_k=sk) for bm in (1, 2, 4) for bn in (1, 2, 4, 8)
              for sk in (1, 2, 4, 8)]
    # AMD's large-M kernel; on sm_90a the TMA and wgmma kernels own large M (the lds tiles
    # never won a cell there, and spill a few registers)
    if get_target(arch).is_hip:
        cands += [c("lds", bm, bn, stages=2, atom=a, wave_tile=w) for bm in (32, 64, 128)
                  for bn in (32, 64, 128) for a in ("", *fam.LARGE_ATOMS)
                  for w in fam.LDS_WAVE_TILES]
    cands += [c("wgmma", bm, bn, stages=s) for bm in (64, 128) for bn in (64, 128)
              for s in (4, 5, 6)]
    cands += [c("tma", bm, bn, stages=s, cluster=cl) for bm in (64, 128) for bn in fam.TMA_WIDTHS
              if bn >= 56 for s in (4, 5, 6) for cl in (1, 2)]
    cands += [c("tma", 256, bn, stages=3) for bn in (64, 96, 112, 128)]   # 3 stages fit
    cands += [c("tma", 128, 256, stages=3)]
    # decode: narrow tiles and deep rings keep 48-64 KB of weights in flight per SM
    cands += [c("tma", 64, bn, stages=s) for bn in (16, 32, 56, 64) for s in (8, 12, 16)]
    fp8 = get_target(arch).fp8_formats[0]
    out = []
    for cfg in cands:
        v = make_variant(fam.FAMILY, arch, fp8=fp8.token, **cfg)
        if validate(v) is None:
            out.append(cfg)
    return out


def compile_all(arch: str, cands: list[dict]) -> None:
    """Build the candidates' modules side by side (each one alone is a serial nvcc / hipcc run)."""
    fp8 = get_target(arch).fp8_formats[0].token
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda c: module_path(make_variant(fam.FAMILY, arch, fp8=fp8, **c)), cands))


def assemblies(arch: str, cands: list[dict]) -> list[tuple[dict, Variant, Path]]:
    """(config, variant, assembly) of each AMD candidate, compiled side by side into the JIT
    cache; the offline toolchain is enough (no GPU, no ROCm)."""
    from .build.jit import compile_variant

    fp8 = get_target(arch).fp8_formats[0].token
    variants = [make_variant(fam.FAMILY, arch, fp8=fp8, **c) for c in cands]
    with ThreadPoolExecutor(16) as pool:
        dirs = list(pool.map(compile_variant, variants))
    return [(c, v, d / f"{v.uri}.s") for c, v, d in zip(cands, variants, dirs)]


def without_spills(arch: str, cands: list[dict]) -> list[dict]:
    """AMD: the candidates whose assembly neither spills nor uses scratch (a compile that does is
    never a fast one, and every build this project ships has none). sm_90a's candidates are
    checked for spills by tests/test_sass.py."""
    if not get_target(arch).is_hip:
        return cands
    from .build.resources import from_amdgpu_asm

    clean = []
    for c, v, asm in assemblies(arch, cands):
        res = from_amdgpu_asm(asm)
        if res["spill_count"] or res["scratch_bytes"]:
            print(f"{v.uri}: {res['spill_count']} registers spilled; left out", file=sys.stderr)
        else:
            clean.append(c)
    return clean


def estimates(arch: str, cands: list[dict]) -> dict[int, tuple]:
    """AMD: candidate index -> (K-loop cycles per wave and K block, waves per block, blocks
    per CU) from each compiled variant's assembly (codegen/build/estimate.py); {} elsewhere or
    where the toolchain wrote no assembly."""
    target = get_target(arch)
    if not target.is_hip:
        return {}
    from .build.resources import from_amdgpu_asm

    fp8 = target.fp8_formats[0]
    out = {}
    for i, cfg in enumerate(cands):
        v = make_variant(fam.FAMILY, arch, fp8=fp8.token, **cfg)
        asm = module_path(v).with_suffix(".s")
        if not asm.exists():
            continue
        est = fam.loop_estimate(v, asm.read_text())
        if est is None:
            continue
        res = from_amdgpu_asm(asm)
        block = fam.block_threads(v)
        out[i] = (est.cycles, -(-block // target.wave_size),
                  target.blocks_per_cu(res["vgpr_count"], res["lds_bytes"], block))
    return out


def print_estimates(arch: str, cands: list[dict]) -> None:
    """Each AMD candidate's static K-loop estimate and registers, from its assembly alone."""
    from .build.resources import from_amdgpu_asm

    print(f"{'variant':66} {'VGPRs':>5} {'spill':>5} {'matrix':>6} {'issue':>6} {'LDS':>6}  "
          f"bound (matrix share)")
    for _, v, asm in assemblies(arch, cands):
        est = fam.loop_estimate(v, asm.read_text())
        if est is not None:
            res = from_amdgpu_asm(asm)
            print(f"{v.uri:66} {res['vgpr_count']:5} {res['spill_count']:5} "
                  f"{est.matrix_cycles:6.0f} {est.issue_cycles:6.0f} {est.lds_cycles:6.0f}  "
                  f"{est.bound} ({est.matrix_fraction:.2f})")


def best_first(cands: list[dict], est: dict[int, tuple], m: int, n: int, k: int, cus: int,
               simds: int) -> list[int]:
    """Candidate indices, those with an estimate first by predicted time, then the others."""
    from .build.estimate import predicted_cycles

    def predicted(i):
        c = cands[i]
        cycles, wpb, blocks = est[i]
        return predicted_cycles(cycles, m, n, k, c["block_m"], c["block_n"], c["split_k"], wpb,
                                blocks, simds, cus)
    ranked = sorted((i for i in est), key=predicted)
    return ranked + [i for i in range(len(cands)) if i not in est]


def incumbent(arch: str, m: int, n: int, k: int, cands: list[dict],
              cus: int | None = None) -> dict | None:
    """What dispatch picks for the cell now (its table entry, else the heuristic) where the
    candidates lack it (--kernels): timed in the same run, so that a restricted run replaces it
    only with something faster."""
    now = fam.pick(arch, m, n, k, cus)
    return None if now in cands else now


def plausible(cfg: dict, m: int) -> bool:
    """Skip configs that cannot win: tiny tiles at large M, block tiles at tiny M."""
    if cfg["kernel"] == "gemv":   # one pass over B per block_m rows of A
        return m <= cfg["block_m"]
    if cfg["kernel"] == "mma":
        return m <= 128 and cfg["block_m"] <= max(16, m)
    if cfg["kernel"] == "tma" and cfg["block_m"] == 64:   # decode too: its A box is fitted to M
        return m >= 16 or cfg["block_n"] <= 64
    return m >= 16


def write_table(path, arch: str, entries: list[dict], base: dict) -> None:
    """Writes base's entries with entries over them (base's order, new cells after) to path,
    through a temporary file that replaces it: a run stopped at any point leaves a whole
    table."""
    merged = dict(base)
    merged.update(((e["m"], e["n"], e["k"]), e) for e in entries)
    data = dict(arch=arch, device=torch.cuda.get_device_name() if torch.cuda.is_available()
                else None, date=time.strftime("%Y-%m-%d"),
                note="written by python -m codegen.tune; us / tflops: the winner's graph time",
                entries=list(merged.values()))
    store.write_atomic(Path(path), json.dumps(data, indent=1) + "\n")


def table_scope(args, arch: str) -> tuple[Path, dict, bool]:
    """Where a run writes its table; the entries its cells go over (that file's where it
    exists, else the arch's table), and whether its last write drops the others: only a run
    over every M bucket, shape and kernel does (--quick times five M values only)."""
    path = Path(args.out) if args.out else fam.table_path(arch)
    base = fam.table_entries(path if path.exists() else fam.table_path(arch))
    return path, base, not (args.ms or args.shapes or args.kernels or args.quick)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m codegen.tune")
    ap.add_argument("--quick", action="store_true", help="fewer M values")
    ap.add_argument("--ms", help="only these M values (comma-separated); the table's other "
                    "entries are kept")
    ap.add_argument("--shapes", help="only these N x K (comma-separated, e.g. 576x7168); the "
                    "table's other entries are kept")
    ap.add_argument("--kernels", help="only candidates of these kernels (comma-separated, e.g. "
                    "tma); the table's other entries are kept")
    ap.add_argument("--top", type=int, help="AMD: time only the N candidates the static "
                    "K-loop estimate ranks first in each cell (default: all, best-first)")
    ap.add_argument("--scales", choices=("row", "col_tma"), default="row",
                    help="the layout of A's scales the candidates are timed with: your engine's "
                    "(col_tma: column-major in 16-byte aligned columns, as DeepGEMM takes them)")
    ap.add_argument("--out", help="table path (default: the repo's table for this arch)")
    ap.add_argument("--estimates", metavar="ARCH", help="print each candidate's static K-loop "
                    "estimate on this AMD arch (cycles per wave and K block) and stop: no GPU")
    args = ap.parse_args(argv)
    from .ops.gemm import gemm_with_config

    if args.estimates:
        try:
            t = get_target(args.estimates)
        except ValueError as e:
            ap.error(f"--estimates: {e}")
        if not (t.is_hip and t.fp8_formats):
            ap.error(f"--estimates: {args.estimates} is not an AMD arch with FP8 matrix "
                     f"instructions")
    try:
        ms = [int(m) for m in args.ms.split(",")] if args.ms else None
        shapes = ([tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
                  if args.shapes else fam.TUNED_SHAPES)
    except ValueError:
        ap.error("--ms / --shapes: expected integers (--ms 1,16) and N x K (--shapes 576x7168)")
    if any(len(s) != 2 or min(s) < 1 for s in shapes) or any(m < 1 for m in ms or ()):
        ap.error("--ms / --shapes: expected M >= 1 and N x K with N, K >= 1")
    shapes = [(n, fam.padded_k(k)) for n, k in shapes]    # the K the op runs and looks up
    if args.top is not None and args.top < 1:
        ap.error(f"--top: {args.top}; expected a count >= 1")
    try:
        arch = args.estimates or native_arch()
    except RuntimeError as e:      # no GPU to tune on
        print(f"python -m codegen.tune: {e}", file=sys.stderr)
        return 2
    target = get_target(arch)
    fp8 = target.fp8_formats[0]
    dtype = getattr(torch, fp8.torch_dtype)
    cands = candidates(arch)
    if args.kernels:
        wanted, kernels = set(args.kernels.split(",")), {c["kernel"] for c in cands}
        if unknown := wanted - kernels:
            ap.error(f"--kernels: {', '.join(sorted(unknown))} not among {arch}'s kernels "
                     f"({', '.join(sorted(kernels))})")
        cands = [c for c in cands if c["kernel"] in wanted]
    if args.estimates:
        print_estimates(arch, cands)
        return 0
    ms = ms or ([1, 16, 64, 1024, 4096] if args.quick else MS)
    t0 = time.time()
    cands = without_spills(arch, cands)     # before the modules: a spilling one gets none
    compile_all(arch, cands)
    print(f"compiled {len(cands)} candidates in {time.time() - t0:.1f} s", file=sys.stderr)
    est = estimates(arch, cands)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    entries = []
    # a restricted run keeps the table's other entries in place; every cell's winner is
    # written as it is found, so a run cut short keeps the cells it finished
    path, base, full = table_scope(args, arch)
    failed = 0
    for m in ms:   # M ascending outside: see bench.gemm_section
        for n, k in shapes:
            nbytes = m * k + n * k + m * n * 2
            sets = [(torch.randn(m, k, device="cuda").to(dtype),
                     a_scales_as(torch.rand(m, -(-k // 128), device="cuda") + 0.5, args.scales),
                     torch.randn(n, k, device="cuda").to(dtype),
                     torch.rand(-(-n // 128), -(-k // 128), device="cuda") + 0.5)
                    for _ in range(input_sets(nbytes))]
            a, sa, b, sb = sets[0]
            ref = reference.gemm_a8w8_blockscale(a, sa, b, sb)
            timed = []

            def calls(cfg):   # make() for bench's graph timing: the cell's input sets in turn
                turn = iter(sets)
                return lambda: (lambda t=next(turn): gemm_with_config(*t, cfg))

            def graph_time(cfg):
                return graph_us(calls(cfg), nbytes)
            order = best_first(cands, est, m, n, k, props.multi_processor_count,
                               target.simds_per_cu)
            if args.top and est:
                order = [i for i in order if i in est][:args.top] + \
                    [i for i in order if i not in est]

            def right(cfg) -> bool:     # the contract's check, as the tests hold each config
                mean, worst, _ = reference.gemm_errors(gemm_with_config(a, sa, b, sb, cfg), ref)
                if mean <= reference.GEMM_MEAN_TOL and worst <= reference.GEMM_ROW_TOL:
                    return True
                print(f"M={m} N={n} K={k}: {cfg} is wrong (mean error {mean:.2g}, worst "
                      f"element {worst:.2g} of its row); left out", file=sys.stderr)
                return False
            for rank, i in enumerate(order):
                cfg = cands[i]
                if plausible(cfg, m) and right(cfg):
                    timed.append((graph_time(cfg), cfg, rank))
            held = incumbent(arch, m, n, k, cands, props.multi_processor_count)
            if held and right(held):
                timed.append((graph_time(held), held, -1))
            if not timed:
                print(f"M={m} N={n} K={k}: no candidate is right; the cell is left as it was",
                      file=sys.stderr)
                failed += 1
                continue
            # the near-equal ones timed in turn (graphs_us), so that a clock or power drift over
            # the sweep does not pick among them
            near = finalists(timed)
            if len(near) > 1:
                again = graphs_us([calls(cfg) for _, cfg, _ in near], nbytes)
                timed = [(us, cfg, rank) for us, (_, cfg, rank) in zip(again, near)]
            del sets
            us, best, rank = min(timed, key=lambda t: t[0])
            entries.append(dict(m=fam.m_bucket(m), n=n, k=k, config=best, us=round(us, 2),
                                tflops=round(2 * m * n * k / us / 1e6, 1)))
            where = f" (estimate's rank {rank + 1} of {len(est)})" if est else ""
            print(f"M={m} N={n} K={k}: {us:.1f} us {entries[-1]['tflops']} TFLOP/s {best}{where}",
                  file=sys.stderr)
            write_table(path, arch, entries, base)
    write_table(path, arch, entries, {} if full and not failed else base)
    print(f"wrote {path}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
