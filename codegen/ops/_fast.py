"""The ops' eager fast path (csrc/fastcall.cpp): one C++ call allocates and launches where the
Python path has checked and recorded a plan for the call's signature (dtypes, devices, sizes
past the rows, strides). Built with torch's extension builder on first use, into the cache dir;
where it cannot be built (no C++ compiler) or CODEGEN_FASTCALL=0, the ops stay on the Python
path, which is complete on its own.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from .. import knobs

SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "fastcall.cpp"
QUANT, NORM, NORM_QUANT, GEMM, DUAL = 1, 2, 3, 4, 5     # fastcall.cpp's Op
LAYOUTS = {"row": 0, "col": 1, "col_tma": 2}

_lock = threading.Lock()
_state: dict = {}
IDS: dict[tuple, int] = {}    # parameter tuple -> id
MOD = None                    # the extension once built (the hot paths read it first)


def module():
    """The built extension, or None (reason printed once)."""
    global MOD
    mod = _state.get("mod", _state)
    if mod is not _state:
        return mod
    with _lock:
        if "mod" not in _state:
            _state["mod"] = MOD = _build()
    return _state["mod"]


def _build():
    if os.environ.get("CODEGEN_FASTCALL", "1") == "0":
        return None
    try:
        import torch
        from torch.utils.cpp_extension import load

        tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"
        out = knobs.cache_dir() / "fastcall" / tag.replace("+", "_")
        out.mkdir(parents=True, exist_ok=True)
        mod = load("codegen_fastcall", [str(SOURCE)], build_directory=str(out),
                   extra_cflags=["-O2"], verbose=False)
        getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if getter is not None:
            mod.set_stream_getter(getter)
        return mod
    except Exception as e:   # no compiler, no headers: the Python path serves every call
        print(f"codegen: eager fast path not built ({type(e).__name__}: {e}); "
              f"the ops use the Python path", file=sys.stderr)
        return None


def param_id(params: tuple) -> int:
    """A small integer for the op's non-tensor parameters (part of a plan's key)."""
    pid = IDS.get(params)
    if pid is None:
        pid = IDS.setdefault(params, len(IDS))
    return pid


def address(fn) -> int:
    import ctypes

    return ctypes.cast(fn, ctypes.c_void_p).value


def clear() -> None:
    mod = _state.get("mod")
    if mod is not None:
        mod.clear()
