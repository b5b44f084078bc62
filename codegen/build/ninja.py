"""build.ninja text: a pure function of its inputs (no clock, no environment)."""
from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..toolchain import (EMU_SHIM, OCLC_ABI_SOURCE, Toolchain, abi_flags, asm_flags,
                         code_object_flags, host_flags)
from .store import write_atomic


@dataclass(frozen=True)
class Edge:
    output: str            # relative to the build dir
    source: str            # relative to the build dir
    kind: str              # "module" or "asm"
    headers: tuple[str, ...] = ()   # absolute paths the source includes


# The emulator's two halves of a gfx variant (codegen.emu): device code object, host launcher.
EMU_OUTPUTS = ("co", "host")
ABI_BC = "oclc_abi.bc"      # built in each build dir from OCLC_ABI_SOURCE (oclc_abi.cl)
SHIM_OBJECT = "hip_shim.o"


def outputs_for(tc: Toolchain, stem: str, emu: bool = False,
                asm: bool = False) -> list[tuple[str, str]]:
    """(output file, rule) pairs a toolchain produces for one source; emu: instead, the code
    object and the CPU launcher the emulator runs (offline gfx toolchain only); asm: the
    device assembly too (gfx toolchains write it anyway; nvcc's is SASS)."""
    if emu:
        if tc.name != "clang":
            raise ValueError(f"emulator outputs need the offline gfx toolchain, not {tc.name}")
        return [(f"{stem}.co", "co"), (f"{stem}.host.so", "host")]
    if tc.name == "nvcc":
        return [(f"{stem}.so", "module")] + ([(f"{stem}.sass", "sass")] if asm else [])
    if tc.name == "rocm":
        return [(f"{stem}.so", "module"), (f"{stem}.s", "asm")]
    return [(f"{stem}.s", "asm")]


# The system headers every HIP source includes (arch_hip.h's), parsed once per build folder into
# a precompiled header that the offline toolchain's device compiles load: the parse of
# hip_runtime.h was most of a variant's compile (gfx1201, 93 variants one at a time: 155 -> 62 s,
# the assembly the same but for the per-file __hip_cuid symbol's name).
PCH_SOURCE, PCH = "hip_system.h", "hip_system.pch"
PCH_TEXT = "#include <hip/hip_runtime.h>\n#include <stdint.h>\n#include <mutex>\n"
_DEVICE_RULES = ("asm", "co")


def uses_pch(tc: Toolchain, edges: list[Edge]) -> bool:
    """A folder of two device compiles or more (an AOT build; a JIT folder holds one)."""
    return tc.name == "clang" and sum(e.kind in _DEVICE_RULES for e in edges) >= 2


def support_files(tc: Toolchain, edges: list[Edge], hip_headers: str = "",
                  env: dict[str, str] | None = None) -> dict[str, str]:
    """Files the builder writes beside build.ninja for these edges (name -> text). hip_headers:
    a content hash of the toolchain's HIP headers, written into the precompiled header's source
    so that it is built again when they (or the compiler, or env: the flags it reads from the
    environment) change: clang does not check system headers against a precompiled header, and
    refuses one built at other flags."""
    files = {"oclc_abi.cl": OCLC_ABI_SOURCE} if any(e.kind == "co" for e in edges) else {}
    if uses_pch(tc, edges):
        inputs = f"{tc.identity}\0{hip_headers}" + (f"\0{sorted(env.items())}" if env else "")
        stamp = hashlib.sha256(inputs.encode()).hexdigest()[:24]
        files[PCH_SOURCE] = f"// compiler and HIP headers {stamp}\n" + PCH_TEXT
    return files


def _escape(path: str) -> str:
    """A path on a build line."""
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _value(words) -> str:
    """A variable's value: shell-quoted words, with ninja's $ escaped."""
    return " ".join(shlex.quote(w) for w in words).replace("$", "$$")


# The compiler's output goes to <out>.log (ptxas -v writes the resource report there); on
# failure it is printed, so ninja shows it, and what the compiler left at $out is removed: ninja
# keeps a failed command's output, and a later build would take a partial file for a module.
_FAILED = " || (rm -f $out; cat $out.log; exit 1)"
_RUN = "$compiler {flags} -o $out $in > $out.log 2>&1" + _FAILED


def ninja_text(tc: Toolchain, edges: list[Edge], disassembler: str = "") -> str:
    """disassembler: cuobjdump, for the SASS edges of an nvcc build."""
    pch = uses_pch(tc, edges)
    use_pch = " -Xclang -include-pch -Xclang " + PCH if pch else ""
    lines = [
        "ninja_required_version = 1.3",
        "compiler = " + _value([tc.compiler]),
        "module_flags = " + _value(tc.flags),
        "asm_flags = " + _value(asm_flags(tc)),
        "",
        "rule module",
        "  command = " + _RUN.format(flags="$module_flags"),
        "  description = module $out",
        "",
        "rule asm",
        "  command = " + _RUN.format(flags="$asm_flags" + use_pch),
        "  description = asm $out",
        "",
    ]
    if pch:
        lines += ["rule pch",
                  "  command = " + _RUN.format(flags="$asm_flags -Xclang -emit-pch"),
                  "  description = precompiled header $out",
                  "",
                  f"build {PCH}: pch {PCH_SOURCE}",
                  ""]
    if any(e.kind in EMU_OUTPUTS for e in edges):
        lines += _emu_rules(tc, use_pch)
    if any(e.kind == "sass" for e in edges):
        lines += _sass_rule(tc, disassembler)
    for e in edges:
        extra = {"co": (ABI_BC,), "host": (SHIM_OBJECT,)}.get(e.kind, ())
        if pch and e.kind in _DEVICE_RULES:
            extra += (PCH,)
        e = Edge(e.output, e.source, e.kind, (*e.headers, *extra))
        implicit = " | " + " ".join(_escape(h) for h in e.headers) if e.headers else ""
        lines.append(f"build {_escape(e.output)}: {e.kind} {_escape(e.source)}{implicit}")
    return "\n".join(lines) + "\n"


def _sass_rule(tc: Toolchain, disassembler: str) -> list[str]:
    """A cubin at the module's flags, disassembled into $out."""
    flags = [f for f in tc.flags if f not in ("-Xcompiler=-fPIC", "-shared")] + ["-cubin"]
    return [
        "sass_flags = " + _value(flags),
        "disassembler = " + _value([disassembler]),
        "",
        "rule sass",
        "  command = $compiler $sass_flags -o $out.cubin $in > $out.log 2>&1 && $disassembler"
        " -sass $out.cubin > $out.tmp && mv $out.tmp $out && rm -f $out.cubin"
        " || (rm -f $out $out.tmp $out.cubin; cat $out.log; exit 1)",
        "  description = sass $out",
        "",
    ]


def _emu_rules(tc: Toolchain, use_pch: str) -> list[str]:
    return [
        "co_flags = " + _value(code_object_flags(tc, ABI_BC)),
        "host_flags = " + _value(host_flags(tc)),
        "",
        "rule abi",
        "  command = $compiler " + _value(abi_flags(tc)) + " -o $out $in",
        "  description = abi $out",
        "",
        "rule co",
        "  command = " + _RUN.format(flags="$co_flags" + use_pch),
        "  description = code object $out",
        "",
        # -fuse-cuid=none: the registration refers to __hip_fatbin, which the shim defines.
        "rule host",
        "  command = ($compiler $host_flags -fuse-cuid=none -c -o $out.o $in && $compiler -shared"
        f" -Wl,-Bsymbolic -o $out $out.o {SHIM_OBJECT} -lstdc++) > $out.log 2>&1" + _FAILED,
        "  description = host launcher $out",
        "",
        "rule shim",
        "  command = $compiler $host_flags -c -o $out $in",
        "  description = hip shim $out",
        "",
        f"build {ABI_BC}: abi oclc_abi.cl",
        f"build {SHIM_OBJECT}: shim {_escape(str(EMU_SHIM))}",
        "",
    ]


def write_if_different(path: Path, text: str) -> bool:
    """Write only when the content changes, so ninja rebuilds only what changed; at once
    (a unique temp name, then rename), so concurrent writers and readers see whole files."""
    try:
        if path.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return True
