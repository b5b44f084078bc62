"""python -m codegen: build, list, explain, doctor, cache.

    python -m codegen build --arch gfx942 [--ops group_quant_fp8,...] [--out DIR] [--jobs N]
                            [--asm] [--emu] [--wheel [DIR]]
    python -m codegen list --arch gfx942 [--out DIR] [--ops ...]
    python -m codegen explain --arch sm_90a gemm_a8w8_blockscale --m 16 --n 2112 --k 7168
    python -m codegen doctor
    python -m codegen cache [clear [--arch A]]

Exit codes: 0 done, 1 some variant failed to build (or doctor found a fault), 2 bad arguments
or an environment that cannot do the work (the message names the cause).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

from . import knobs, paths
from .targets import TARGETS, get_target, native_arch


class CliError(Exception):
    """A cause the user can act on: printed as one line, exit code 2."""


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _target(arch: str):
    try:
        return get_target(native_arch() if arch == "native" else arch)
    except (ValueError, RuntimeError) as e:
        raise CliError(f"--arch: {e}" + (", or native" if arch != "native" else "")) from None


def _ops(text: str | None) -> list[str] | None:
    if not text:
        return None
    from .spec import families

    ops = [o.strip() for o in text.split(",") if o.strip()]
    unknown = [o for o in ops if o not in families()]
    if unknown:
        raise CliError(f"--ops: unknown {', '.join(unknown)}; expected some of "
                       f"{', '.join(families())}")
    return ops


# ---- build ----

def cmd_build(args) -> int:
    target, ops = _target(args.arch), _ops(args.ops)   # bad arguments before any output
    knobs.build_jobs()                                  # and a bad CODEGEN_JOBS
    from tqdm import tqdm

    from .build.aot import build
    from .build.store import StorageError
    from .toolchain import ToolchainError, find

    try:
        if args.wheel is not None and not find(target).loadable:   # before compiling it all
            raise CliError(f"--wheel: the toolchain found for {target.arch} builds assembly "
                           f"only; set ROCM_PATH to a ROCm install for loadable gfx modules")
        with tqdm(desc=f"compiling for {target.arch}", unit="file", file=sys.stderr) as bar:
            manifest = build(target, ops=ops, jobs=args.jobs, out_dir=args.out,
                             progress=bar, emu=args.emu, asm=args.asm)
    except (ToolchainError, StorageError) as e:
        raise CliError(str(e)) from None
    out = (args.out or paths.aot_dir()) / target.arch
    code = summarize(manifest, out, ops)
    _build_fast_path()
    if args.wheel is not None:
        from .build.wheel import pack

        whl = pack(out, target.arch, Path(args.wheel) if args.wheel else out.parent).resolve()
        print(f"wheel: {whl}\n  pip install {whl}   # then any process on a {target.arch} host "
              f"loads these modules with no JIT")
    return code


def _build_fast_path() -> None:
    """The ops' C++ eager path (host code, any target), so that no first call waits for it."""
    import time

    from .ops import _fast

    t0 = time.time()
    mod = _fast.module(wait=True)
    print(f"eager fast path: {'ready' if mod else 'not built (the ops use the Python path)'} "
          f"({time.time() - t0:.1f} s)")


def summarize(manifest: dict, out: Path, ops=None) -> int:
    """Prints the folder's manifest by family; 1 where a variant of the families built now
    (ops; None: all) failed, 0 otherwise (another family's row may be from an earlier run)."""
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
    print(f"manifest: {out / 'manifest.json'}")
    from .spec import families

    built = set(ops or families())
    return 1 if any(r["status"] == "failed" and r["op"] in built for r in rows) else 0


# ---- list ----

def cmd_list(args) -> int:
    target = _target(args.arch)
    folder = (args.out or paths.aot_dir()) / target.arch
    path = folder / "manifest.json"
    if not path.exists():
        pre = paths.prebuilt_dir(target.arch)
        if args.out is None and pre is not None and (pre / "manifest.json").exists():
            path = pre / "manifest.json"
        else:
            raise CliError(f"no manifest at {path}: build one with "
                           f"`python -m codegen build --arch {target.arch}`")
    try:
        rows = json.loads(path.read_text())["variants"]
    except (ValueError, KeyError, TypeError) as e:
        raise CliError(f"{path} is damaged ({type(e).__name__}: {e}); build again with "
                       f"`python -m codegen build --arch {target.arch}`") from None
    if args.ops:
        rows = [r for r in rows if r["op"] in _ops(args.ops)]
    print(f"{path}")
    print(f"{'variant':<58} {'status':<8} {'VGPR':>5} {'spill':>5} {'LDS':>6} {'occ':>4}  note")
    for r in rows:
        fig = [r.get(k) for k in ("vgpr_count", "spill_count", "lds_bytes", "occupancy")]
        fig = ["-" if x is None else x for x in fig]
        print(f"{r['uri']:<58} {r['status']:<8} {fig[0]:>5} {fig[1]:>5} {fig[2]:>6} {fig[3]:>4}"
              f"  {r.get('reason') or ''}"[:160].rstrip())
    counts = Counter(r["status"] for r in rows)
    print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 0


# ---- explain ----

def _param(text: str):
    if "=" not in text:
        raise CliError(f"{text!r}: expected axis=value (e.g. dtype=bf16)")
    name, value = text.split("=", 1)
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    try:
        return name, int(value)
    except ValueError:
        return name, value


def explain(arch: str, op: str, params: dict, m=None, n=None, k=None, hidden=None,
            cus=None) -> list[str]:
    """Lines saying which variant serves the call on arch and why, and where its module is;
    cus: the device's multiprocessors (a partition's), else the target's full part."""
    from .dispatch import Unsupported, variant_for
    from .families import gemm, rmsnorm
    from .families.rmsnorm_quant import quant_tiers
    from .spec import families, load_family

    if op not in families():
        raise CliError(f"op: unknown {op!r}; expected one of {', '.join(families())}")
    if cus is not None and op != gemm.FAMILY:
        raise CliError(f"--cus: explain uses it for the GEMM's config pick only, not {op}")
    lines = []
    if op == gemm.FAMILY:
        if None in (m, n, k):
            raise CliError(f"{op}: give the shape: --m M --n N --k K")
        k_given, k = k, gemm.padded_k(k)   # as the op pads it
        if not get_target(arch).has_fp8:
            return [f"unsupported: arch {arch} has no FP8 support"]
        if max(m, n, k) >= 2**31:      # as the op refuses it
            return [f"unsupported: dimensions ({m}, {n}, {k}) must be below 2^31"]
        entry = gemm.table(arch).get((gemm.m_bucket(m), n, k))
        cfg = gemm.pick(arch, m, n, k, cus)
        cus_said = (f"{cus} multiprocessors (--cus)" if cus else
                    f"{get_target(arch).multiprocessors} multiprocessors assumed, the full part's; "
                    f"--cus for a partition")
        how = (f"table hit in {gemm.table_path(arch).name} at (M bucket {gemm.m_bucket(m)}, "
               f"N {n}, K {k})" if entry else
               f"heuristic by M, N and K (no table entry for M bucket {gemm.m_bucket(m)}, N {n}, "
               f"K {k} on {arch}; {cus_said})")
        lines.append(f"config: {json.dumps(cfg)}")
        lines.append(f"why: {how}")
        if k != k_given:
            lines.append(f"K: {k_given} is read as {k}: A and B are copied per call into "
                         f"zero-padded rows (rows are read 16 bytes at a time)")
        target = get_target(arch)
        if target.has_fp8:
            params = {**cfg, "fp8": gemm.fp8_token(target, target.fp8_format().name), **params}
        else:
            params = {**cfg, **params}
    axes = {a.name: a.values for a in load_family(op).axes}
    unknown = set(params) - set(axes) - {"fp8_max"}
    if unknown:
        raise CliError(f"{op}: no axis {', '.join(sorted(unknown))}; its axes are "
                       f"{', '.join(sorted(axes))}")
    for name, value in params.items():
        if isinstance(axes.get(name), tuple) and value not in axes[name]:
            raise CliError(f"{op}: {name}={value!r} is not one of {axes[name]}")
    if op == "rmsnorm" and hidden is not None and "load" not in params:
        size = {"bf16": 2, "fp16": 2, "fp32": 4}.get(params.get("dtype", "bf16"), 2)
        params = {**params, "load": "vec16" if hidden * size % 16 == 0 else "scalar"}
    assumed = {a.name: a.values[0] for a in load_family(op).axes
               if a.name not in params and a.name != "fp8" and isinstance(a.values, tuple)}
    params = {**params, **assumed}
    try:
        v = variant_for(op, arch, **params)
    except (Unsupported, ValueError) as e:
        return lines + [f"unsupported: {e}"]
    lines.insert(0, f"variant: {v.uri}")
    if assumed:
        lines.insert(1, "assumed: " + " ".join(f"{k}={json.dumps(x)}" for k, x in
                                                assumed.items()) + " (give axis=value to pick)")
    if hidden is not None and "dtype" in params and op != gemm.FAMILY:
        wave = get_target(arch).wave_size
        table = (quant_tiers(v["dtype"], wave, v["residual"])
                 if op == "rmsnorm_group_quant" else None)
        tier = rmsnorm.tier_for(hidden, v["dtype"], wave, table)
        if op != "group_quant_fp8":
            notes = [", two passes over the row"] if tier.two_pass else []
            if tier.split > 1:
                notes.append(f", summing as {tier.tpr * tier.split} threads x "
                             f"{tier.items // tier.split} chunks do; those take grids that fit "
                             f"on the device at once")
            lines.append(f"row kernel for H={hidden}: {tier.tpr} threads per row, "
                         f"{tier.items} chunks of 8 per thread, {tier.block}-thread blocks"
                         f"{''.join(notes)} (picked by the launcher at run time)")
    if op == gemm.FAMILY and v["kernel"] == "mma":
        atom = gemm.atom_for(arch, "mma", "")
        bound, cap = gemm.mma_min_blocks(v, atom), gemm.mma_register_cap(v, atom)
        lines.append(f"mma waves hold {'two K blocks' if v['stages'] == 2 else 'one K block'} "
                     f"of fragments in registers" + (
                         f"; {bound} blocks an SM asked of the compiler (at most {cap} registers "
                         f"a lane)"
                         if bound else ""))
        if v["l2_first_pass"]:
            lines.append("each block starts its first pass over its weight rows into L2 before "
                         "it waits for the grid before (l2_first_pass)")
    lines.append(f"module: {_where(v)}")
    return lines


def _where(v) -> str:
    from .build import jit
    from .render import render
    from .toolchain import ToolchainError, find

    found = jit.aot_module(v)
    if found:
        return f"ahead-of-time build {found}"
    try:
        tc = find(v.target)
    except ToolchainError as e:
        return f"none built, and no toolchain to build it ({e})"
    final = knobs.cache_dir() / v.arch / v.uri / jit.cache_key(v, render(v), tc)
    if final.exists():
        return f"JIT cache {final}"
    if not tc.loadable:
        return (f"none built; {tc.name} builds its assembly only (python -m codegen build), not "
                f"a loadable module: set ROCM_PATH to a ROCm install, or install prebuilt kernels")
    return f"not built yet: the first call builds it with {tc.name} into {final.parent}"


def cmd_explain(args) -> int:
    target = _target(args.arch)
    params = dict(_param(p) for p in args.params)
    for line in explain(target.arch, args.op, params, args.m, args.n, args.k, args.hidden,
                        args.cus):
        print(line)
    return 0


# ---- doctor ----

def cmd_doctor(args) -> int:
    from . import __version__
    from .toolchain import ToolchainError, cuobjdump, find, hip_headers_from_triton

    faults = 0
    print(f"codegen {__version__} from {paths.PACKAGE}"
          f"{' (source checkout)' if paths.CHECKOUT else ''}")
    for what, p, pattern in (("templates", paths.TEMPLATE_DIR, "*.j2"),
                             ("headers", paths.INCLUDE_DIR / "codegen", "*"),
                             ("specs", paths.SPEC_DIR, "*.toml"),
                             ("tables", paths.TABLE_DIR, "*.json")):
        n = len(list(p.glob(pattern)))
        ok = n > 0
        faults += not ok
        print(f"  {what:<10} {'ok' if ok else 'MISSING':<8} {n} in {p}")
    print("toolchains")
    for arch, target in TARGETS.items():
        try:
            tc = find(target)
            lines = tc.version.splitlines() or ["?"]
            version = next((v for v in lines if "release" in v), lines[0]).strip()
            kind = "modules" if tc.loadable else "assembly only (set ROCM_PATH for modules)"
            if tc.name == "nvcc":
                kind += f"; --asm SASS by {cuobjdump(tc) or 'nothing: no cuobjdump found'}"
            print(f"  {arch:<8} {tc.name:<6} {tc.compiler}  {version}  -> {kind}")
        except ToolchainError as e:
            print(f"  {arch:<8} missing: {e}")
    hip = hip_headers_from_triton()
    print(f"HIP headers (triton wheel): {hip or 'not found: pip install triton'}; "
          f"ROCM_PATH: {knobs.rocm_path() or 'unset'}")
    for what, folder, origin in (("JIT cache", knobs.cache_dir(), knobs.cache_dir_origin()),
                                 ("AOT folder", paths.aot_dir(), paths.aot_dir_origin())):
        state = _folder_state(folder)
        faults += state.startswith("NOT")
        print(f"{what}: {folder} ({state}; chosen by {origin})")
    pre = [(a, d) for a in TARGETS if (d := paths.prebuilt_dir(a))]
    print("prebuilt kernels: " + (", ".join(f"{a} ({d})" for a, d in pre) if pre else
                                  "none installed (python -m codegen build --arch A --wheel)"))
    print(_gpu_line())
    try:
        knobs.build_jobs()
        knobs.lock_timeout()
    except ValueError as e:
        faults += 1
        print(f"environment: {e}")
    return 1 if faults else 0


def _folder_state(folder: Path) -> str:
    import os

    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"NOT usable: {probe} is not a folder"
    if not os.access(probe, os.W_OK):
        return f"NOT writable ({probe})"
    return "exists, writable" if folder.exists() else "will be created"


def _gpu_line() -> str:
    try:
        import torch

        if not torch.cuda.is_available():
            return "GPU: none visible to torch (the ops need one; build and list work without)"
        from .targets import device_arch

        devs = [f"{i}: {torch.cuda.get_device_name(i)} ({device_arch(torch.device('cuda', i))})"
                for i in range(torch.cuda.device_count())]
        return "GPU: " + "; ".join(devs)
    except Exception as e:      # doctor reports; it never fails on a GPU query
        return f"GPU: query failed ({e})"


# ---- cache ----

FASTCALL_DIR = "fastcall"     # the eager fast path's extension (ops/_fast.py)


def cmd_cache(args) -> int:
    """The cache folder holds one folder per arch and the fast path's; only those are listed
    and cleared (the folder may be shared with other files)."""
    root = knobs.cache_dir()
    if args.arch:
        owned = [root / _target(args.arch).arch]
    else:
        owned = [root / a for a in (*TARGETS, FASTCALL_DIR)]
    if args.action == "clear":
        from .build import store

        cleared = [t for t in owned if t.exists()]
        for t in cleared:
            store.clear(t, knobs.cache_dir_origin())
        print(f"cleared {', '.join(map(str, cleared)) or 'nothing'} (in {root})")
        return 0
    print(f"JIT cache: {root} (chosen by {knobs.cache_dir_origin()})")
    total = 0
    for folder in owned:
        if not folder.is_dir() or all(p.suffix == ".lock" for p in folder.iterdir()):
            continue       # absent, or cleared (its lock files stay: store.clear)
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        mods = sum(1 for _ in folder.glob("*/*/artifact.json"))
        total += size
        what = "eager fast path" if folder.name == FASTCALL_DIR else f"{mods:>4} modules"
        print(f"  {folder.name:<8} {what:<15} {size / 2**20:8.1f} MiB")
    print(f"  total {total / 2**20:.1f} MiB" if total else "  empty")
    return 0


# ---- entry ----

def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m codegen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    archs = f"one of {', '.join(TARGETS)}, or native"

    b = sub.add_parser("build", help="build every default variant of a target ahead of time")
    b.add_argument("--arch", required=True, help=archs)
    b.add_argument("--ops", help="comma-separated kernel families (default: all)")
    b.add_argument("--jobs", type=positive_int, help="parallel compile jobs (default: ninja's)")
    b.add_argument("--out", type=Path, help="output folder; the build goes into OUT/<arch>/ "
                   "(default: CODEGEN_AOT_DIR, generated/ in a checkout, else "
                   "~/.local/share/codegen)")
    b.add_argument("--emu", action="store_true", help="gfx targets: also the code objects and "
                   "CPU launchers the AMD ISA emulator runs")
    b.add_argument("--asm", action="store_true", help="sm_90a: also each variant's SASS "
                   "(<uri>.sass; gfx targets write their assembly, <uri>.s, always)")
    b.add_argument("--wheel", nargs="?", const="", metavar="DIR",
                   help="also pack the arch's modules into an installable wheel (in DIR, "
                        "default beside OUT/<arch>)")
    b.set_defaults(run=cmd_build)

    ls = sub.add_parser("list", help="the manifest of an ahead-of-time build as a table")
    ls.add_argument("--arch", required=True, help=archs)
    ls.add_argument("--out", type=Path, help="the folder build wrote into")
    ls.add_argument("--ops", help="only these families")
    ls.set_defaults(run=cmd_list)

    ex = sub.add_parser("explain", help="which variant and GEMM config serve a call, and why")
    ex.add_argument("--arch", required=True, help=archs)
    ex.add_argument("op", help="kernel family, e.g. gemm_a8w8_blockscale, rmsnorm")
    ex.add_argument("params", nargs="*", help="axis=value, e.g. dtype=bf16 group_size=128")
    ex.add_argument("--m", type=positive_int)
    ex.add_argument("--n", type=positive_int)
    ex.add_argument("--k", type=positive_int)
    ex.add_argument("--hidden", type=positive_int, help="row length H (RMSNorm family)")
    ex.add_argument("--cus", type=positive_int, help="the device's multiprocessors (CUs / SMs), "
                    "where a partition has fewer than the part (GEMM heuristic)")
    ex.set_defaults(run=cmd_explain)

    d = sub.add_parser("doctor", help="toolchains, HIP headers, folders, GPUs: what is missing")
    d.set_defaults(run=cmd_doctor)

    c = sub.add_parser("cache", help="JIT cache size, or clear it")
    c.add_argument("action", nargs="?", choices=("info", "clear"), default="info")
    c.add_argument("--arch", help="clear only this arch")
    c.set_defaults(run=cmd_cache)
    return ap


def main(argv=None) -> int:
    ap = parser()
    args, rest = ap.parse_known_args(argv)
    # explain's axis=value pairs may follow its options (argparse takes positionals once)
    if rest and args.command == "explain" and all("=" in r and r[0] != "-" for r in rest):
        args.params += rest
    elif rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        rc = args.run(args)
        sys.stdout.flush()        # a closed pipe shows here, not at exit
        return rc
    except BrokenPipeError:       # `... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # nor at exit's flush
        return 0
    except CliError as e:
        print(f"codegen {args.command}: {e}", file=sys.stderr)
        return 2
    except ValueError as e:       # a bad knob or argument found deeper down
        print(f"codegen {args.command}: {e}", file=sys.stderr)
        return 2
