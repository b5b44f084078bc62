"""build.ninja text: a pure function of its inputs (no clock, no environment)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ..toolchain import Toolchain, asm_flags


@dataclass(frozen=True)
class Edge:
    output: str            # relative to the build dir
    source: str            # relative to the build dir
    kind: str              # "module" or "asm"
    headers: tuple[str, ...] = ()   # absolute paths the source includes


def outputs_for(tc: Toolchain, stem: str) -> list[tuple[str, str]]:
    """(output file, rule) pairs a toolchain produces for one source."""
    if tc.name == "nvcc":
        return [(f"{stem}.so", "module")]
    if tc.name == "rocm":
        return [(f"{stem}.so", "module"), (f"{stem}.s", "asm")]
    return [(f"{stem}.s", "asm")]


def _escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def ninja_text(tc: Toolchain, edges: list[Edge]) -> str:
    # The compiler's output goes to <out>.log (ptxas -v writes the resource report there);
    # on failure it is printed, so ninja shows it.
    run = "$compiler {flags} -o $out $in > $out.log 2>&1 || (cat $out.log; exit 1)"
    lines = [
        "ninja_required_version = 1.3",
        f"compiler = {shlex.quote(tc.compiler)}",
        "module_flags = " + " ".join(shlex.quote(f) for f in tc.flags),
        "asm_flags = " + " ".join(shlex.quote(f) for f in asm_flags(tc)),
        "",
        "rule module",
        "  command = " + run.format(flags="$module_flags"),
        "  description = module $out",
        "",
        "rule asm",
        "  command = " + run.format(flags="$asm_flags"),
        "  description = asm $out",
        "",
    ]
    for e in edges:
        implicit = " | " + " ".join(_escape(h) for h in e.headers) if e.headers else ""
        lines.append(f"build {_escape(e.output)}: {e.kind} {_escape(e.source)}{implicit}")
    return "\n".join(lines) + "\n"


def write_if_different(path: Path, text: str) -> bool:
    """Write only when the content changes, so ninja rebuilds only what changed."""
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True
