"""The environment variables that choose folders, toolchains and build limits, typed and
documented in one place. The others stay beside their one reader: CODEGEN_FASTCALL in
ops/_fast.py, the bench's peers in peers.py, CODEGEN_PDL in the CUDA modules and
CODEGEN_REQUIRE_ISA in the tests."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def home() -> Path:
    """The user's home; a per-user temp folder where there is none (no HOME and no passwd
    entry, as containers run under an arbitrary user id)."""
    try:
        return Path.home()
    except RuntimeError:
        return Path(tempfile.gettempdir()) / f"codegen-home-{os.getuid()}"


def cache_dir() -> Path:
    """CODEGEN_CACHE_DIR: where JIT-built modules live (default $XDG_CACHE_HOME/codegen)."""
    explicit = _path("CODEGEN_CACHE_DIR")
    if explicit:
        return explicit.absolute()     # the same folder after a chdir
    base = _path("XDG_CACHE_HOME") or home() / ".cache"
    return base / "codegen"


def cache_dir_origin() -> str:
    """What chose cache_dir(), for error messages."""
    if os.environ.get("CODEGEN_CACHE_DIR"):
        return "CODEGEN_CACHE_DIR"
    if os.environ.get("XDG_CACHE_HOME"):
        return "XDG_CACHE_HOME (set CODEGEN_CACHE_DIR to choose another)"
    return "the default ~/.cache/codegen (set CODEGEN_CACHE_DIR to choose another)"


def aot_dir() -> Path | None:
    """CODEGEN_AOT_DIR: where build.py's modules are looked up first (default generated/)."""
    return _path("CODEGEN_AOT_DIR")


def rocm_path() -> Path | None:
    """ROCM_PATH: a ROCm install; its hipcc/amdclang++ build loadable modules for gfx targets."""
    return _path("ROCM_PATH")


def clang() -> str:
    """CODEGEN_CLANG: the clang for offline gfx assembly when ROCm is absent (default clang-22)."""
    return os.environ.get("CODEGEN_CLANG", "clang-22")


def nvcc() -> str | None:
    """CODEGEN_NVCC: the nvcc to use for sm_90a (default: nvcc on PATH, then CUDA_HOME/bin)."""
    return os.environ.get("CODEGEN_NVCC")


def _positive(name: str, what: str, convert=int):
    value = os.environ.get(name)
    if not value:
        return None
    try:
        n = convert(value)
    except ValueError:
        n = 0
    if not n > 0:
        raise ValueError(f"{name}={value!r}: expected a positive number ({what})")
    return n


def build_jobs() -> int | None:
    """CODEGEN_JOBS: parallel compile jobs for build.py and JIT, a positive integer (default:
    ninja's choice)."""
    return _positive("CODEGEN_JOBS", "parallel compile jobs")


def lock_timeout() -> float:
    """CODEGEN_LOCK_TIMEOUT: seconds to wait for a build lock another process holds before
    giving up with its holder named (default 600); the wait is reported after 5 s."""
    return _positive("CODEGEN_LOCK_TIMEOUT", "seconds", float) or 600.0


def amd_emulator() -> Path | None:
    """CODEGEN_AMD_EMULATOR: a tinygrad checkout whose mock AMD GPU runs gfx code objects (the
    emu tests, codegen.emu); unset: those tests skip."""
    return _path("CODEGEN_AMD_EMULATOR")


# Read by the generated CUDA launchers themselves (templates/include/codegen/arch_cuda.cuh), once
# per module: CODEGEN_PDL=0 launches kernels without programmatic dependent launch.
