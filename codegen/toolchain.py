"""Find the compiler for a target and say who it is (its identity goes into the cache key).

- nvcc: loadable modules for sm_90a.
- rocm: hipcc (amdclang++) from ROCM_PATH: loadable modules and assembly for gfx targets.
- clang: Debian's clang-22 + lld-22 with the HIP headers shipped in the triton wheel:
  gfx assembly and its resource report only (no device libraries, no loadable module).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from . import knobs
from .render import INCLUDE_DIR
from .targets import Target


class ToolchainError(RuntimeError):
    pass


@dataclass(frozen=True)
class Toolchain:
    name: str             # "nvcc", "rocm" or "clang"
    compiler: str         # resolved path
    version: str          # the compiler's own version text
    flags: tuple[str, ...]  # everything but inputs and outputs
    loadable: bool        # builds a module we can load and run

    @property
    def identity(self) -> str:
        return f"{self.name}:{self.compiler}:{self.version}"


def _version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


@cache
def _which(exe: str) -> str | None:
    found = shutil.which(exe)
    return os.path.realpath(found) if found else None


def hip_headers_from_triton() -> Path | None:
    """The dir holding include/hip/hip_runtime.h inside the triton wheel, if installed."""
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if not spec or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "backends" / "amd"
    return path if (path / "include" / "hip" / "hip_runtime.h").exists() else None


COMMON = ("-O3", "-std=c++17", f"-I{INCLUDE_DIR}")


@cache
def find(target: Target) -> Toolchain:
    """The best toolchain present for a target, or ToolchainError saying what is missing."""
    if target.vendor == "nvidia":
        exe = knobs.nvcc() or _which("nvcc")
        if not exe and os.environ.get("CUDA_HOME"):
            exe = str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
        if not exe or not Path(exe).exists():
            raise ToolchainError(f"arch {target.arch}: nvcc not found (PATH, CODEGEN_NVCC, CUDA_HOME)")
        cc = target.arch.removeprefix("sm_")
        flags = (f"-gencode=arch=compute_{cc},code=sm_{cc}", *COMMON, "-Xcompiler=-fPIC",
                 "-shared", "-Xptxas=-v")
        return Toolchain("nvcc", exe, _version(exe), flags, True)

    rocm = knobs.rocm_path()
    if rocm and (rocm / "bin" / "hipcc").exists():
        exe = str((rocm / "bin" / "hipcc").resolve())
        flags = ("-x", "hip", f"--offload-arch={target.arch}", *COMMON, "-fPIC", "-shared")
        return Toolchain("rocm", exe, _version(exe), flags, True)

    exe = _which(knobs.clang())
    headers = hip_headers_from_triton()
    if not exe or not headers:
        raise ToolchainError(
            f"arch {target.arch}: no HIP toolchain. Set ROCM_PATH to a ROCm install, or install "
            f"{knobs.clang()} + lld and the triton wheel (its HIP headers); `make setup` does this")
    flags = ("-x", "hip", f"--offload-arch={target.arch}", "-nogpulib", "--cuda-device-only",
             *COMMON, f"--rocm-path={headers}")
    return Toolchain("clang", exe, _version(exe), flags, False)


def cuobjdump(tc: Toolchain) -> str | None:
    """The SASS disassembler for an nvcc toolchain: beside nvcc, on PATH, or triton's copy."""
    beside = Path(tc.compiler).parent / "cuobjdump"
    if beside.exists():
        return str(beside)
    if exe := _which("cuobjdump"):
        return exe
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else None


EMU_SHIM = Path(__file__).resolve().parent / "emu" / "hip_shim.hip"


def asm_flags(tc: Toolchain) -> tuple[str, ...]:
    """Flags that make a HIP toolchain emit device assembly (.s) instead of a module."""
    flags = [f for f in tc.flags if f not in ("-fPIC", "-shared")]
    if "--cuda-device-only" not in flags:
        flags.append("--cuda-device-only")
    return (*flags, "-S")


# The ABI constant ROCm's oclc_abi_version_500.bc defines, which the device library reads.
OCLC_ABI_SOURCE = ('__attribute__((visibility("hidden"))) __constant int __oclc_ABI_version'
                   ' = 500;\n')


def hip_include_dir(tc: Toolchain) -> Path | None:
    """The HIP headers a gfx toolchain compiles against (their content goes into the key)."""
    if tc.name == "clang":
        rocm_path = next((f for f in tc.flags if f.startswith("--rocm-path=")), None)
        return Path(rocm_path.split("=", 1)[1]) / "include" if rocm_path else None
    if tc.name == "rocm":   # ROCM_PATH's first: its bin/hipcc may resolve into lib/llvm/bin
        for root in (knobs.rocm_path(), Path(tc.compiler).parent.parent):
            if root and (root / "include" / "hip").is_dir():
                return root / "include" / "hip"
    return None


def device_library(tc: Toolchain) -> Path:
    """ockl.bc (what threadIdx / gridDim go through) shipped beside the HIP headers."""
    rocm_path = next(f for f in tc.flags if f.startswith("--rocm-path="))
    return Path(rocm_path.split("=", 1)[1]) / "lib" / "ockl.bc"


def code_object_flags(tc: Toolchain, abi_bc: str) -> tuple[str, ...]:
    """A loadable gfx code object (ELF) from the offline toolchain: the assembly flags without
    -S, unbundled, with the device library and the ABI constant linked in."""
    flags = [f for f in asm_flags(tc) if f != "-S"]
    return (*flags, "--no-gpu-bundle-output", "-Xclang", "-mlink-builtin-bitcode", "-Xclang",
            str(device_library(tc)), "-Xclang", "-mlink-builtin-bitcode", "-Xclang", abi_bc)


def abi_flags(tc: Toolchain) -> tuple[str, ...]:
    arch = next(f for f in tc.flags if f.startswith("--offload-arch=")).split("=", 1)[1]
    return ("-x", "cl", "-cl-std=CL2.0", "-target", "amdgcn-amd-amdhsa", f"-mcpu={arch}",
            "-nogpulib", "-c", "-emit-llvm")


def host_flags(tc: Toolchain) -> tuple[str, ...]:
    """The host half of a HIP source, compiled for this CPU (the emulator's launchers):
    no device pass, no HIP runtime library; -O1 is plenty for a launcher."""
    flags = [f for f in tc.flags if f not in ("--cuda-device-only", "-O3")]
    return (*flags, "--cuda-host-only", "-O1", "-fPIC")
