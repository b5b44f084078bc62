"""Just-in-time builds into a content-addressed cache.

A module lives at <cache>/<arch>/<uri>/<key>/ and is only ever created by an atomic rename of
a finished staging dir, under a per-variant file lock with a second look after taking it:
N processes starting cold build each module once, and a build killed halfway leaves only a
staging dir that nothing loads (the next build of the variant removes it). Each published dir
records its outputs' sizes and hashes; a lookup that finds them changed or gone evicts the dir
and builds it again, once, under the lock.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import __version__, knobs, paths
from ..render import included_headers, render, source_suffix
from ..spec import Variant
from ..toolchain import EMU_SHIM, Toolchain, device_library, find, hip_include_dir
from . import store
from .ninja import Edge, ninja_text, outputs_for, support_files
from .store import StorageError, file_hash

ABI = "ctypes-1"   # how modules are bound; bump when the launcher convention changes
BUILDS = 0   # modules this process compiled (tests read it)


class CompileError(RuntimeError):
    def __init__(self, variant: Variant, command: str, output: str, source: Path):
        self.variant, self.command, self.output, self.source = variant, command, output, source
        super().__init__(
            f"compiling {variant.uri} for {variant.arch} failed\n"
            f"  source: {source}\n  command: {command}\n"
            f"  repro: ninja -C {source.parent}\n--- compiler output ---\n{output}")


def source_key(variant: Variant, source: str) -> str:
    """Content hash of what the module is made from, whatever compiles it: an ahead-of-time
    module with this key serves on any host (prebuilt kernels need no local compiler)."""
    parts = {
        "source": source,
        "headers": {p.name: p.read_text() for p in included_headers(source)},
        "arch": variant.arch,
        "version": __version__,
        "abi": ABI,
        "uri": variant.uri,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


# Read by the compilers themselves: they change a module's bytes without changing its command.
COMPILER_ENV = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CCC_OVERRIDE_OPTIONS",
                "HIPCC_COMPILE_FLAGS_APPEND", "HIPCC_LINK_FLAGS_APPEND", "HIP_CLANG_PATH",
                "HIP_DEVICE_LIB_PATH", "COMPILER_PATH", "CPATH", "CPLUS_INCLUDE_PATH")


def compiler_env() -> dict[str, str]:
    """Those of COMPILER_ENV that are set."""
    return {k: os.environ[k] for k in COMPILER_ENV if os.environ.get(k)}


def cache_key(variant: Variant, source: str, tc: Toolchain, emu: bool = False) -> str:
    """Content hash of everything that decides the bytes of the built module; emu: also of
    the emulator outputs (codegen.emu) and what they link."""
    parts = {
        "source_key": source_key(variant, source),
        "hip_headers": store.tree_hash(hip) if (hip := hip_include_dir(tc)) else None,
        "toolchain": tc.identity,
        "flags": list(tc.flags),
    }
    if env := compiler_env():
        parts["compiler_env"] = env       # absent when unset: the keys of plain builds stay
    if emu:
        parts["emu"] = {"shim": file_hash(EMU_SHIM),
                        "device_library": file_hash(device_library(tc))}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


# ninja is started through this, which asks for SIGTERM when the Python process that started it
# dies (ninja then stops the commands it runs, so a killed build leaves no compiler running) and
# becomes ninja. Not a preexec_fn: forking with one runs the interpreter's before-fork handlers,
# which wait for locks (logging's, imports') that another thread may hold while it waits in turn.
_WITH_PARENT = ("import ctypes, os, sys\n"
                "try:\n"
                "    ctypes.CDLL(None, use_errno=True).prctl(1, 15)\n"   # PR_SET_PDEATHSIG, TERM
                "except (OSError, AttributeError):\n"
                "    pass\n"
                "if os.getppid() != int(sys.argv[1]):\n"                 # the parent died first
                "    sys.exit(143)\n"
                "os.execv(sys.argv[2], sys.argv[2:])\n")


def run_ninja(build_dir: Path, targets: list[str] | None = None, jobs: int | None = None,
              on_line=None) -> subprocess.CompletedProcess:
    cmd = [_ninja(), "-C", str(build_dir)]
    jobs = jobs if jobs is not None else knobs.build_jobs()
    if jobs is not None:
        if not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs: expected a positive integer, got {jobs!r}")
        cmd += ["-j", str(jobs)]
    cmd += targets or []
    env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
    if sys.platform.startswith("linux") and sys.executable:
        cmd = [sys.executable, "-I", "-S", "-c", _WITH_PARENT, str(os.getpid()), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)
        proc.wait()
    except BaseException:          # interrupted: stop ninja and what it runs, then re-raise
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
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
    """A loadable module for the variant: an ahead-of-time build of the same source if one is
    current (generated/, CODEGEN_AOT_DIR, an installed prebuilt package), else JIT."""
    return aot_module(variant) or compile_variant(variant, loadable=True)


def read_key(keyfile: Path) -> tuple[str, int, str, str | None] | None:
    """An ahead-of-time output's record: (cache key, size, sha256, source key), or None if
    unreadable."""
    try:
        key, size, digest, *skey = keyfile.read_text().split()
        return key, int(size), digest, (skey[0] if skey else None)
    except (OSError, ValueError):
        return None


def key_record(key: str, output: Path, skey: str) -> str:
    size, digest = store.describe(output)
    return f"{key} {size} {digest} {skey}\n"


def _unchanged(output: Path, rec) -> bool:
    return output.exists() and output.stat().st_size == rec[1] and store.sha256(output) == rec[2]


def aot_current(output: Path, key: str) -> bool:
    """output is the ahead-of-time build for key, unchanged since it was built."""
    rec = read_key(output.with_name(output.name + ".key"))
    return rec is not None and rec[0] == key and _unchanged(output, rec)


def aot_module(variant: Variant) -> Path | None:
    """The first ahead-of-time module built from this variant's source, unchanged since."""
    skey = None
    for d in paths.module_dirs(variant.arch):
        so = d / f"{variant.uri}.so"
        rec = read_key(so.with_name(so.name + ".key"))
        if rec is None:
            continue
        skey = skey or source_key(variant, render(variant))
        if rec[3] != skey:
            continue
        if _unchanged(so, rec):
            return so
        print(f"codegen: {so} differs from what was built; not loading it", file=sys.stderr)
    return None


def emu_outputs(variant: Variant) -> tuple[Path, Path]:
    """(code object, CPU launcher) of a gfx variant for the emulator: build.py --emu's when
    current, else built into the JIT cache."""
    tc = find(variant.target)
    key = cache_key(variant, render(variant), tc, emu=True)
    names = [out for out, _ in outputs_for(tc, variant.uri, emu=True)]
    d = paths.aot_dir() / variant.arch
    if all(aot_current(d / n, key) for n in names):
        return d / names[0], d / names[1]
    built = compile_variant(variant, emu=True)
    return built / names[0], built / names[1]


_verified: set[Path] = set()    # published dirs this process has checked


def compile_variant(variant: Variant, loadable: bool = False, emu: bool = False) -> Path:
    """Build (or find in the JIT cache) one variant; returns its build dir, or the .so if
    loadable. emu: the build dir also holds the code object and CPU launcher the emulator
    runs."""
    tc = find(variant.target)
    if loadable and not tc.loadable:
        raise RuntimeError(f"toolchain {tc.name} for {variant.arch} builds assembly only, "
                           f"not a loadable module; set ROCM_PATH to a ROCm install")
    knobs.build_jobs()                              # a bad CODEGEN_JOBS fails before any work
    source = render(variant)
    key = cache_key(variant, source, tc, emu)
    origin = knobs.cache_dir_origin()
    base = knobs.cache_dir() / variant.arch / variant.uri
    final = base / key
    names = [out for out, _ in outputs_for(tc, variant.uri, emu)]
    if final not in _verified and final.exists() and store.damage(final, names) is None:
        _verified.add(final)     # published and whole: no lock (a read-only cache serves)
    if final not in _verified or not final.exists():
        store.ensure_dir(base, origin)
        with store.locked(Path(str(base) + ".lock"), origin):
            store.ensure_dir(base, origin)     # cache clear may have removed it meanwhile
            # second look, under the lock: another process may have built (or repaired) it
            reason = store.damage(final, names) if final.exists() else None
            if final.exists() and reason:
                print(f"codegen: cached {variant.uri} for {variant.arch} is damaged ({reason}); "
                      f"rebuilding it", file=sys.stderr)
                _evict(final)
            if not final.exists():
                store.remove_dead_staging(base)
                try:
                    _build_and_publish(variant, source, tc, base, final, names, emu)
                except OSError as e:
                    raise store.storage_error(e, origin) from None
        _verified.add(final)
    if loadable:
        return final / f"{variant.uri}.so"
    return final


def _evict(final: Path) -> None:
    """Moves a published dir out of the way at once (rename), then removes it."""
    gone = final.with_name(f".evicted-{final.name}-{os.getpid()}")
    shutil.rmtree(gone, ignore_errors=True)
    final.rename(gone)
    shutil.rmtree(gone, ignore_errors=True)
    _verified.discard(final)


def evict_module(variant: Variant, module: Path) -> None:
    """A cached module failed to load: evict its dir so the next lookup builds it again."""
    final = module.parent
    if knobs.cache_dir() in final.parents and final.exists():
        with store.locked(Path(str(final.parent) + ".lock"), knobs.cache_dir_origin()):
            if final.exists():
                print(f"codegen: {module} does not load; rebuilding {variant.uri}",
                      file=sys.stderr)
                _evict(final)


_STORAGE_FAILURES = ("No space left on device", "Read-only file system", "Disk quota exceeded")


def _build_and_publish(variant: Variant, source: str, tc: Toolchain, base: Path,
                       final: Path, names: list[str], emu: bool = False) -> None:
    global BUILDS
    BUILDS += 1
    staging = Path(tempfile.mkdtemp(prefix=store.staging_prefix(), dir=base))
    try:
        src = staging / f"{variant.uri}{source_suffix(variant)}"
        src.write_text(source)
        headers = tuple(str(p) for p in included_headers(source))
        edges = [Edge(out, src.name, rule, headers)
                 for out, rule in outputs_for(tc, variant.uri, emu)]
        for name, text in support_files(tc, edges, env=compiler_env()).items():
            (staging / name).write_text(text)
        (staging / "build.ninja").write_text(ninja_text(tc, edges))
        result = run_ninja(staging)
        if result.returncode != 0:
            output = result.stdout + result.stderr
            keep = base / f"failed-{final.name}"
            shutil.rmtree(keep, ignore_errors=True)
            for out in names:                     # partial outputs go; logs and source stay
                (staging / out).unlink(missing_ok=True)
            staging.rename(keep)
            storage = next((m for m in _STORAGE_FAILURES if m in output), None)
            if storage or not output.strip():
                free = shutil.disk_usage(base).free >> 20
                raise StorageError(
                    f"building {variant.uri} in {base} failed: "
                    f"{storage or 'the compiler said nothing'} ({free} MiB free; the folder is "
                    f"chosen by {knobs.cache_dir_origin()}); log in {keep}")
            raise CompileError(variant, f"ninja -C {keep}", output, keep / src.name)
        store.record(staging, names)
        store.share(staging)
        staging.rename(final)    # atomic publish
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
