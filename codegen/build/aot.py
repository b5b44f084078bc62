"""Ahead-of-time build of every default variant of a target into generated/<arch>/."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..families import get as get_family
from ..render import included_headers, render, source_suffix
from ..spec import Variant, enumerate_variants, families, validate
from ..targets import Target
from ..toolchain import Toolchain, find
from .jit import GENERATED, cache_key, run_ninja
from .ninja import Edge, ninja_text, outputs_for, support_files, write_if_different
from .resources import from_amdgpu_asm, from_ptxas_log


@dataclass
class Entry:
    variant: Variant
    status: str = "ok"           # ok | skipped | failed
    reason: str = ""
    key: str = ""
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
          out_dir: Path | None = None, progress=None, emu: bool = False) -> dict:
    """Render, compile and describe every variant; returns the manifest (also written).
    emu: also the code object and CPU launcher the AMD emulator runs (codegen.emu)."""
    out = (out_dir or GENERATED) / target.arch
    out.mkdir(parents=True, exist_ok=True)
    tc = find(target)
    entries = plan(target, ops)
    edges = []
    for e in entries:
        if e.status != "ok":
            continue
        text = render(e.variant)
        src = f"{e.variant.uri}{source_suffix(e.variant)}"
        write_if_different(out / src, text)
        e.key = cache_key(e.variant, text, tc)
        headers = tuple(str(p) for p in included_headers(text))
        e.outputs = [(o, rule, e.key) for o, rule in outputs_for(tc, e.variant.uri)]
        if emu:
            emu_key = cache_key(e.variant, text, tc, emu=True)
            e.outputs += [(o, rule, emu_key) for o, rule in outputs_for(tc, e.variant.uri, True)]
        for output, rule, key in e.outputs:
            _drop_if_stale(out, output, key)
            edges.append(Edge(output, src, rule, headers))
    for name, text in support_files(edges).items():
        write_if_different(out / name, text)
    write_if_different(out / "build.ninja", ninja_text(tc, edges))
    total = len(edges)
    on_line = None
    if progress is not None:
        progress.reset(total=total)

        def on_line(line):
            m = re.match(r"\[(\d+)/(\d+)\]", line)
            if m:
                progress.n = int(m.group(1))
                progress.refresh()
    result = run_ninja(out, ["-k", "0"], jobs=jobs, on_line=on_line)
    manifest = _manifest(target, tc, entries, out, result.stdout)
    write_if_different(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    write_if_different(out / "dispatch.json", json.dumps(_dispatch(entries), indent=1) + "\n")
    return manifest


_MANIFEST_FIELD = {"asm": "asm", "module": "module", "co": "code_object", "host": "emu_launcher"}


def _drop_if_stale(out: Path, output: str, key: str) -> None:
    """A module built by another compiler or version is rebuilt even if ninja thinks it fresh."""
    keyfile = out / f"{output}.key"
    if keyfile.exists() and keyfile.read_text().strip() != key:
        (out / output).unlink(missing_ok=True)


def _manifest(target: Target, tc: Toolchain, entries: list[Entry], out: Path, log: str) -> dict:
    variants = []
    for e in entries:
        v = e.variant
        row = {"uri": v.uri, "op": v.family, "dtype": v.get("dtype"),
               "group_size": v.get("group_size"),
               "fp8_format": v.fp8.name if v.fp8 else None,
               "fp8_max": v.fp8.max if v.fp8 else None,
               "status": e.status, "reason": e.reason, "source": None, "asm": None,
               "module": None, "code_object": None, "emu_launcher": None}
        row.update(dict.fromkeys(("vgpr_count", "sgpr_count", "spill_count", "scratch_bytes",
                                  "lds_bytes", "wavefront_size", "occupancy")))
        row["params"] = dict(v.params)
        if e.status == "ok":
            row["source"] = f"{v.uri}{source_suffix(v)}"
            missing = [o for o, _, _ in e.outputs if not (out / o).exists()]
            if missing:
                row["status"] = "failed"
                row["reason"] = _failure(out, missing[0], log)
            else:
                for o, rule, key in e.outputs:
                    (out / f"{o}.key").write_text(key + "\n")
                    row[_MANIFEST_FIELD[rule]] = o
                    if rule == "module":
                        (out / f"{v.uri}.key").write_text(key + "\n")
                res = (from_amdgpu_asm(out / row["asm"]) if row["asm"]
                       else from_ptxas_log(out / f"{row['module']}.log"))
                row.update(res)
                block = get_family(v.family).context(v).get("block", target.wave_size)
                row["occupancy"] = target.occupancy(res["vgpr_count"], res["lds_bytes"], block)
        variants.append(row)
    return {"arch": target.arch, "toolchain": tc.identity.split("\n")[0], "variants": variants}


def _failure(out: Path, output: str, log: str) -> str:
    p = out / f"{output}.log"
    text = p.read_text() if p.exists() else log
    errors = [line for line in text.splitlines() if "error" in line]
    return (errors[0] if errors else text.strip()[-500:]) or "compile failed"


def _dispatch(entries: list[Entry]) -> dict:
    """op -> list of (axis values -> uri) for every built variant."""
    table: dict[str, list] = {}
    for e in entries:
        if e.status == "ok":
            table.setdefault(e.variant.family, []).append(
                {"key": dict(e.variant.params), "uri": e.variant.uri})
    return table
