"""Just-in-time builds into a content-addressed cache.

A module lives at <cache>/<arch>/<uri>/<key>/ and is only ever created by an atomic rename of
a finished staging dir, under a per-variant file lock with a second look after taking it:
N processes starting cold build each module once, and a build killed halfway leaves only a
staging dir that nothing loads.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from filelock import FileLock

from .. import __version__, knobs
from ..render import ROOT, included_headers, render, source_suffix
from ..spec import Variant
from ..toolchain import Toolchain, find
from ..toolchain import EMU_SHIM, device_library
from .ninja import Edge, ninja_text, outputs_for, support_files

ABI = "ctypes-1"   # how modules are bound; bump when the launcher convention changes
GENERATED = ROOT / "generated"
BUILDS = 0   # modules this process compiled (tests read it)


class CompileError(RuntimeError):
    def __init__(self, variant: Variant, command: str, output: str, source: Path):
        self.variant, self.command, self.output, self.source = variant, command, output, source
        super().__init__(
            f"compiling {variant.uri} for {variant.arch} failed\n"
            f"  source: {source}\n  command: {command}\n"
            f"  repro: ninja -C {source.parent}\n--- compiler output ---\n{output}")


@cache
def _file_hash(path: Path, _stamp: tuple) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_hash(path: Path) -> str:
    """Content hash of a file, recomputed when its size or mtime changes."""
    st = path.stat()
    return _file_hash(path, (st.st_size, st.st_mtime_ns))


def cache_key(variant: Variant, source: str, tc: Toolchain, emu: bool = False) -> str:
    """Content hash of everything that decides the bytes of the built module; emu: also of
    the emulator outputs (codegen.emu) and what they link."""
    h = hashlib.sha256()
    parts = {
        "source": source,
        "headers": {p.name: p.read_text() for p in included_headers(source)},
        "toolchain": tc.identity,
        "flags": list(tc.flags),
        "arch": variant.arch,
        "version": __version__,
        "abi": ABI,
        "uri": variant.uri,
    }
    if emu:
        parts["emu"] = {"shim": file_hash(EMU_SHIM), "device_library": file_hash(device_library(tc))}
    h.update(json.dumps(parts, sort_keys=True).encode())
    return h.hexdigest()[:24]


def run_ninja(build_dir: Path, targets: list[str] | None = None, jobs: int | None = None,
              on_line=None) -> subprocess.CompletedProcess:
    cmd = [_ninja(), "-C", str(build_dir)]
    if jobs or knobs.build_jobs():
        cmd += ["-j", str(jobs or knobs.build_jobs())]
    cmd += targets or []
    env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
    if on_line is None:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        on_line(line)
    proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), "")


def _ninja() -> str:
    exe = shutil.which("ninja")
    if exe:
        return exe
    try:
        import ninja

        return str(Path(ninja.BIN_DIR) / "ninja")
    except ImportError:
        raise RuntimeError("ninja not found: pip install ninja") from None


def module_path(variant: Variant) -> Path:
    """A loadable module for the variant: an ahead-of-time build if current, else JIT."""
    return compile_variant(variant, loadable=True)


def _aot_module(variant: Variant, key: str) -> Path | None:
    d = (knobs.aot_dir() or GENERATED) / variant.arch
    so, keyfile = d / f"{variant.uri}.so", d / f"{variant.uri}.key"
    if so.exists() and keyfile.exists() and keyfile.read_text().strip() == key:
        return so
    return None


def emu_outputs(variant: Variant) -> tuple[Path, Path]:
    """(code object, CPU launcher) of a gfx variant for the emulator: build.py --emu's when
    current, else built into the JIT cache."""
    tc = find(variant.target)
    key = cache_key(variant, render(variant), tc, emu=True)
    names = [out for out, _ in outputs_for(tc, variant.uri, emu=True)]
    d = (knobs.aot_dir() or GENERATED) / variant.arch
    if all((d / f"{n}.key").exists() and (d / f"{n}.key").read_text().strip() == key
           for n in names):
        return d / names[0], d / names[1]
    built = compile_variant(variant, emu=True)
    return built / names[0], built / names[1]


def compile_variant(variant: Variant, loadable: bool = False, emu: bool = False) -> Path:
    """Build (or find in the cache) one variant; returns its build dir, or the .so if loadable.
    emu: the build dir also holds the code object and CPU launcher the emulator runs."""
    tc = find(variant.target)
    if loadable and not tc.loadable:
        raise RuntimeError(f"toolchain {tc.name} for {variant.arch} builds assembly only, "
                           f"not a loadable module; set ROCM_PATH to a ROCm install")
    source = render(variant)
    key = cache_key(variant, source, tc, emu)
    if loadable and (aot := _aot_module(variant, key)):
        return aot
    base = knobs.cache_dir() / variant.arch / variant.uri
    final = base / key
    if not final.exists():
        base.mkdir(parents=True, exist_ok=True)
        with FileLock(str(base) + ".lock"):
            if not final.exists():    # second look: another process may have built it
                _build_and_publish(variant, source, tc, base, final, emu)
    if loadable:
        return final / f"{variant.uri}.so"
    return final


def _build_and_publish(variant: Variant, source: str, tc: Toolchain, base: Path,
                       final: Path, emu: bool = False) -> None:
    global BUILDS
    BUILDS += 1
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=base))
    try:
        src = staging / f"{variant.uri}{source_suffix(variant)}"
        src.write_text(source)
        headers = tuple(str(p) for p in included_headers(source))
        edges = [Edge(out, src.name, rule, headers)
                 for out, rule in outputs_for(tc, variant.uri, emu)]
        for name, text in support_files(edges).items():
            (staging / name).write_text(text)
        (staging / "build.ninja").write_text(ninja_text(tc, edges))
        result = run_ninja(staging)
        if result.returncode != 0:
            keep = base / f"failed-{final.name}"
            shutil.rmtree(keep, ignore_errors=True)
            staging.rename(keep)
            raise CompileError(variant, f"ninja -C {keep}", result.stdout + result.stderr,
                               keep / src.name)
        staging.rename(final)    # atomic publish
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
