"""Where the package reads its own files and where it writes: the same code serves a source
checkout and an installed wheel, and an installed package never writes beside itself."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from . import knobs

PACKAGE = Path(__file__).resolve().parent
_parent = PACKAGE.parent
# A source checkout keeps templates/ and generated/ beside the package (the design card's
# layout); a wheel carries the templates inside the package.
CHECKOUT = _parent if (_parent / "pyproject.toml").is_file() and (_parent / "templates").is_dir() \
    else None
TEMPLATE_DIR = PACKAGE / "templates" if (PACKAGE / "templates").is_dir() else _parent / "templates"
INCLUDE_DIR = TEMPLATE_DIR / "include"
SPEC_DIR = PACKAGE / "specs"
TABLE_DIR = PACKAGE / "tables"


def aot_dir() -> Path:
    """Where ahead-of-time builds go and are looked up first: CODEGEN_AOT_DIR, else generated/
    of a source checkout, else $XDG_DATA_HOME/codegen (~/.local/share/codegen)."""
    explicit = knobs.aot_dir()
    if explicit:
        return explicit
    if CHECKOUT is not None:
        return CHECKOUT / "generated"
    data = Path(os.environ.get("XDG_DATA_HOME") or knobs.home() / ".local" / "share")
    return data / "codegen"


def aot_dir_origin() -> str:
    if knobs.aot_dir():
        return "CODEGEN_AOT_DIR"
    return f"the default {aot_dir()} (set CODEGEN_AOT_DIR or pass --out to choose another)"


def prebuilt_package(arch: str) -> str:
    """Import name of the package `python -m codegen build --arch A --wheel` makes."""
    return f"codegen_kernels_{arch}"


def prebuilt_dir(arch: str) -> Path | None:
    """The folder of an installed prebuilt-kernel package for arch, if one is installed."""
    try:
        spec = importlib.util.find_spec(prebuilt_package(arch))
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def module_dirs(arch: str) -> list[Path]:
    """Folders whose ahead-of-time modules for arch are loaded before any JIT build, in order."""
    dirs = [aot_dir() / arch]
    pre = prebuilt_dir(arch)
    if pre is not None:
        dirs.append(pre)
    return dirs
