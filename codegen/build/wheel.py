"""One arch's ahead-of-time modules as an installable wheel (python -m codegen build --wheel).

The wheel holds the import package codegen_kernels_<arch>: the modules, their key records, the
sources they were built from and the manifest. Once installed, every process on a host of that
arch loads them before looking at any JIT cache, with no compiler present (codegen.paths,
codegen.build.jit.aot_module); a module whose source no longer matches is not loaded.
"""
from __future__ import annotations

import base64
import hashlib
import sysconfig
import zipfile
from pathlib import Path

from .. import __version__, paths
from . import store

SHIPPED = ("*.so", "*.so.key", "*.hip", "*.cu", "manifest.json", "dispatch.json")


def distribution(arch: str) -> str:
    return f"fp8_codegen_kernels_{arch}"


def _platform_tag() -> str:
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def pack(build_dir: Path, arch: str, out_dir: Path) -> Path:
    """Writes <out_dir>/fp8_codegen_kernels_<arch>-<version>-py3-none-<platform>.whl."""
    modules = sorted(build_dir.glob("*.so"))
    if not modules:
        raise ValueError(f"--wheel: {build_dir} holds no loadable module (the toolchain built "
                         f"assembly only; set ROCM_PATH to a ROCm install for gfx modules)")
    unkeyed = [m.name for m in modules if not m.with_name(m.name + ".key").exists()]
    if unkeyed:
        raise ValueError(f"--wheel: {', '.join(unkeyed[:3])} in {build_dir} have no key record; "
                         f"build again")
    pkg, dist = paths.prebuilt_package(arch), distribution(arch)
    info = f"{dist}-{__version__}.dist-info"
    files: dict[str, bytes] = {
        f"{pkg}/__init__.py": (f'"""Prebuilt fp8-codegen kernels for {arch}; codegen loads them '
                               f'from here."""\nARCH = "{arch}"\n').encode()}
    for pattern in SHIPPED:
        for f in sorted(build_dir.glob(pattern)):
            files[f"{pkg}/{f.name}"] = f.read_bytes()
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {__version__}\n"
        f"Summary: Prebuilt fp8-codegen kernels for {arch}\n"
        f"Requires-Dist: fp8-codegen=={__version__}\n").encode()
    tag = f"py3-none-{_platform_tag()}"
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: fp8-codegen {__version__}\n"
                              f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
    record = [f"{name},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}"
              for name, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()

    out_dir.mkdir(parents=True, exist_ok=True)
    whl = out_dir / f"{dist}-{__version__}-{tag}.whl"
    tmp = whl.with_name(f".{whl.name}.{store.staging_prefix()}")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    tmp.replace(whl)
    return whl


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
