"""Ahead-of-time build of every default variant of a target into <aot dir>/<arch>/."""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..families import get as get_family
from ..render import included_headers, render, source_suffix
from .. import knobs, paths
from ..spec import Variant, enumerate_variants, families, validate
from ..targets import Target
from ..toolchain import Toolchain, ToolchainError, cuobjdump, find, hip_include_dir
from . import store
from .jit import aot_current, cache_key, compiler_env, key_record, run_ninja, source_key
from .ninja import Edge, ninja_text, outputs_for, support_files, write_if_different
from .resources import from_amdgpu_asm, from_ptxas_log


@dataclass
class Entry:
    variant: Variant
    status: str = "ok"           # ok | skipped | failed
    reason: str = ""
    key: str = ""
    source_key: str = ""
    outputs: list = field(default_factory=list)   # (file, rule, key)


def plan(target: Target, ops: list[str] | None) -> list[Entry]:
    entries = []
    for fam in ops or families():
        chooser = getattr(get_family(fam), "variants", None)   # families that build a subset
        for v in (chooser(target) if chooser else enumerate_variants(fam, target)):
            reason = validate(v)
            entries.append(Entry(v, "skipped", reason) if reason else Entry(v))
    return entries


def build(target: Target, ops: list[str] | None = None, jobs: int | None = None,
          out_dir: Path | None = None, progress=None, emu: bool = False,
          asm: bool = False) -> dict:
    """Render, compile and describe every variant; returns the manifest (also written), with
    the families not built this time kept as they were. emu: also the code object and CPU
    launcher the AMD emulator runs (codegen.emu). asm: also each variant's SASS on sm_90a
    (gfx builds write their assembly anyway). Builds of one folder are serialized by a
    lock in it; a run with nothing to do writes nothing (a read-only folder is fine then)."""
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs: expected a positive integer, got {jobs!r}")
    knobs.build_jobs()
    origin = "--out" if out_dir else paths.aot_dir_origin()
    out = store.ensure_dir((out_dir or paths.aot_dir()) / target.arch, origin)
    tc = find(target)
    disassembler = cuobjdump(tc) if asm and tc.name == "nvcc" else ""
    if asm and tc.name == "nvcc" and not disassembler:
        raise ToolchainError(f"--asm: cuobjdump not found (beside {tc.compiler}, on PATH, or "
                             f"in the triton package)")
    entries = plan(target, ops)
    files: dict[str, str] = {}          # generated text files: name -> content
    edges = []
    for e in entries:
        if e.status != "ok":
            continue
        text = render(e.variant)
        src = f"{e.variant.uri}{source_suffix(e.variant)}"
        files[src] = text
        e.key = cache_key(e.variant, text, tc)
        e.source_key = source_key(e.variant, text)
        headers = tuple(str(p) for p in included_headers(text))
        e.outputs = [(o, rule, e.key) for o, rule in outputs_for(tc, e.variant.uri, asm=asm)]
        if emu:
            emu_key = cache_key(e.variant, text, tc, emu=True)
            e.outputs += [(o, rule, emu_key) for o, rule in outputs_for(tc, e.variant.uri, True)]
        edges += [Edge(output, src, rule, headers) for output, rule, _ in e.outputs]
    hip = hip_include_dir(tc)
    files.update(support_files(tc, edges, store.tree_hash(hip) if hip else "", compiler_env()))
    files["build.ninja"] = ninja_text(tc, edges, disassembler)

    def work() -> tuple[list[str], list[str]]:
        # an nvcc module whose log (its registers and spills) is gone is built again too
        stale = [o for e in entries if e.status == "ok" for o, rule, key in e.outputs
                 if not aot_current(out / o, key) or (tc.name == "nvcc" and rule == "module"
                                                      and not (out / f"{o}.log").exists())]
        return stale, [n for n, t in files.items() if _read(out / n) != t]
    if work() == ([], []):
        manifest, texts = _merged(out, target, ops, _manifest(target, tc, entries, out, ""),
                                  _dispatch(entries))
        if all(_read(out / n) == t for n, t in texts.items()):
            return manifest   # a read-only folder stays usable; a change waits for the lock
    with store.locked(out / ".build.lock", origin):
        try:
            stale, changed = work()  # second look: a build that held the lock may have done it
            for output in stale:     # built for another key, changed or gone: built again
                (out / output).unlink(missing_ok=True)
            for n in changed:
                write_if_different(out / n, files[n])
            log = _run(out, jobs, progress, len(edges)).stdout if stale or changed else ""
            return _publish(out, target, ops, _manifest(target, tc, entries, out, log),
                            _dispatch(entries), origin)
        except OSError as e:
            raise store.storage_error(e, origin) from None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _run(out: Path, jobs, progress, total: int):
    if progress is None:
        return run_ninja(out, ["-k", "0"], jobs=jobs)
    progress.reset(total=total)

    def on_line(line):
        m = re.match(r"\[(\d+)/(\d+)\]", line)
        if m:     # ninja's count (the precompiled header's step included)
            progress.n, progress.total = int(m.group(1)), int(m.group(2))
            progress.refresh()
    return run_ninja(out, ["-k", "0"], jobs=jobs, on_line=on_line)


def _read_json(path: Path) -> dict:
    """A folder's manifest or dispatch table, {} where there is none; a damaged one is said and
    written anew (its entries for the families not built now are lost)."""
    text = _read(path)
    try:
        value = json.loads(text) if text is not None else {}
        if isinstance(value, dict):
            return value
    except ValueError:
        pass
    print(f"codegen: {path} is damaged; writing it anew", file=sys.stderr)
    return {}


def _merged(out: Path, target: Target, ops, manifest: dict, table: dict) -> tuple[dict, dict]:
    """This run's families merged into the folder's manifest and dispatch table: the manifest,
    and the two files' texts."""
    built = set(ops or families())
    old = _read_json(out / "manifest.json")
    if old.get("arch") == target.arch:
        kept = [r for r in old.get("variants", []) if r.get("op") not in built]
        manifest["variants"] = sorted(kept + manifest["variants"], key=lambda r: r["op"])
    old_table = _read_json(out / "dispatch.json")
    table = dict(sorted({**{k: v for k, v in old_table.items() if k not in built},
                         **table}.items()))
    return manifest, {"manifest.json": json.dumps(manifest, indent=1) + "\n",
                      "dispatch.json": json.dumps(table, indent=1) + "\n"}


def _publish(out: Path, target: Target, ops, manifest: dict, table: dict, origin: str) -> dict:
    """Merges this run's families into the folder's manifest and dispatch table (under the
    folder's lock: another build's rows are not written over)."""
    manifest, texts = _merged(out, target, ops, manifest, table)
    try:
        for name, text in texts.items():
            write_if_different(out / name, text)
    except OSError as e:
        raise store.storage_error(e, origin) from None
    return manifest


_MANIFEST_FIELD = {"asm": "asm", "module": "module", "co": "code_object", "host": "emu_launcher",
                   "sass": "sass"}


def _manifest(target: Target, tc: Toolchain, entries: list[Entry], out: Path, log: str) -> dict:
    variants = []
    for e in entries:
        v = e.variant
        row = {"uri": v.uri, "op": v.family, "dtype": v.get("dtype"),
               "group_size": v.get("group_size"),
               "fp8_format": v.fp8.name if v.fp8 else None,
               "fp8_max": v.fp8.max if v.fp8 else None,
               "status": e.status, "reason": e.reason, "source": None, "asm": None,
               "sass": None, "module": None, "code_object": None, "emu_launcher": None}
        row.update(dict.fromkeys(("vgpr_count", "sgpr_count", "spill_count", "scratch_bytes",
                                  "lds_bytes", "wavefront_size", "occupancy")))
        row["params"] = dict(v.params)
        if e.status == "ok":
            row["source"] = f"{v.uri}{source_suffix(v)}"
            missing = [o for o, _, _ in e.outputs if not (out / o).exists()]
            if missing:
                e.status, e.reason = "failed", _failure(out, missing[0], log)
                row.update(status=e.status, reason=e.reason)
            else:
                for o, rule, key in e.outputs:
                    record = key_record(key, out / o, e.source_key)
                    write_if_different(out / f"{o}.key", record)
                    row[_MANIFEST_FIELD[rule]] = o
                    if rule == "module":
                        write_if_different(out / f"{v.uri}.key", record)
                if row["asm"] and "amdhsa.kernels" not in (out / row["asm"]).read_text():
                    e.status = "failed"
                    e.reason = f"{row['asm']} holds no kernel metadata (damaged?)"
                    row.update(status=e.status, reason=e.reason)
                    variants.append(row)
                    continue
                res = (from_amdgpu_asm(out / row["asm"]) if row["asm"]
                       else from_ptxas_log(out / f"{row['module']}.log"))
                row.update(res)
                block = get_family(v.family).context(v).get("block", target.wave_size)
                row["occupancy"] = target.occupancy(res["vgpr_count"], res["lds_bytes"], block)
                loop_estimate = getattr(get_family(v.family), "loop_estimate", None)
                if row["asm"] and loop_estimate:
                    est = loop_estimate(v, (out / row["asm"]).read_text())
                    row["estimate"] = est.as_dict() if est else None
        variants.append(row)
    return {"arch": target.arch, "toolchain": tc.identity.split("\n")[0], "variants": variants}


def _failure(out: Path, output: str, log: str) -> str:
    p = out / f"{output}.log"
    text = p.read_text() if p.exists() else log
    errors = [line for line in text.splitlines() if "error" in line]
    return (errors[0] if errors else text.strip()[-500:]) or "compile failed"


def _dispatch(entries: list[Entry]) -> dict:
    """op -> list of (axis values -> uri) for every built variant (after _manifest, which marks
    the failed ones)."""
    table: dict[str, list] = {}
    for e in entries:
        if e.status == "ok":
            table.setdefault(e.variant.family, []).append(
                {"key": dict(e.variant.params), "uri": e.variant.uri})
    return table
