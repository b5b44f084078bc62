"""The ops' eager fast path (csrc/fastcall.cpp): one C++ call allocates and launches where the
Python path has checked and recorded a plan for the call's signature (dtypes, devices, sizes
past the rows, strides). Built with torch's extension builder into the cache dir: by
`python -m codegen build`, or else in a background thread from the first call on, the calls
meanwhile on the Python path (which is complete on its own), so that no call waits for a C++
compile of torch's headers. Where it cannot be built (no C++ compiler) or CODEGEN_FASTCALL=0,
the ops stay on the Python path.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from .. import knobs
from ._common import on_emulator

SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "fastcall.cpp"
QUANT, NORM, NORM_QUANT, GEMM, DUAL = 1, 2, 3, 4, 5     # fastcall.cpp's Op
LAYOUTS = {"row": 0, "col": 1, "col_tma": 2}

_lock = threading.Lock()
_state: dict = {}
IDS: dict[tuple, int] = {}    # parameter tuple -> id
MOD = None                    # the extension once built (the hot paths read it first)


def module(wait: bool = False):
    """The built extension, or None: not built yet (the first call starts the build; wait:
    until it ends) or not buildable (reason printed once)."""
    mod = _state.get("mod", _state)
    if mod is not _state:
        return mod
    if os.environ.get("CODEGEN_FASTCALL", "1") == "0":
        _state["mod"] = None
        return None
    with _lock:
        if "thread" not in _state:
            try:
                # imported here, not in the thread: a fork while another thread imports (and
                # logs, as setuptools' modules do) can deadlock in the interpreter's
                # before-fork handlers, and the caller may fork next (DataLoader workers)
                import torch.utils.cpp_extension  # noqa: F401
            except Exception:
                pass                      # _build says why
            # not a daemon: an exit mid-build would leave the builder's lock file behind, on
            # which every later process would wait
            _state["thread"] = threading.Thread(target=_finish_build, name="codegen-fastcall")
            _state["thread"].start()
    if wait:
        _state["thread"].join()
    return _state.get("mod")


def _finish_build() -> None:
    global MOD
    MOD = mod = _build()
    _state["mod"] = mod


# Where the folder's lock lies (beside it); another layout sharing the cache never meets this
# one in the same folder.
FOLDER_LAYOUT = "l2"


def build_dir() -> Path:
    """The extension's folder in the cache: named by torch's and Python's versions and the
    source's hash, so that a build of another source is never reused."""
    import hashlib

    import torch

    source = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    tag = (f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{source}"
           f"-{FOLDER_LAYOUT}")
    return knobs.cache_dir() / "fastcall" / tag.replace("+", "_")


def _build():
    try:
        import torch
        from torch.utils.cpp_extension import load

        from ..build import store

        out = build_dir()
        out.parent.mkdir(parents=True, exist_ok=True)
        # torch's own build lock is a plain file, left behind by a build that was killed, and
        # then waited on forever: under this lock (the OS releases it) any such file is stale.
        # The lock lies beside the folder it guards, as the JIT cache's (store.clear).
        with store.locked(out.with_name(out.name + ".lock"), knobs.cache_dir_origin()):
            out.mkdir(exist_ok=True)
            (out / "lock").unlink(missing_ok=True)
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


def call(name: str, params: tuple, *tensors):
    """The C++ path's result for an eager call of op `name`, or None (no plan for its
    signature, an unhashable parameter, or no extension: keep() starts its build, after a
    call's first launch)."""
    fast = MOD
    if fast is None:
        return None
    try:
        pid = IDS.get(params)
    except TypeError:          # an unhashable parameter: the Python path says what is wrong
        return None
    if pid is None:            # parameters no plan was recorded with
        return None
    return getattr(fast, name)(pid, *tensors)


def keep(op: int, params: tuple, tensors: tuple, kern: tuple, out_dtype, ints: tuple = (),
         eps: float = 0.0) -> None:
    """Records a checked and launched call's plan for the C++ path (GPU tensors only: the
    emulator's host tensors stay on the Python path)."""
    fast = module()
    if fast is None or on_emulator(tensors[0]):
        return
    try:
        pid = param_id(params)
    except TypeError:          # an unhashable parameter: no plan
        return
    fast.record(op, pid, tensors, address(kern[0]), kern[1], out_dtype, ints, eps)


def clear() -> None:
    mod = _state.get("mod")
    if mod is not None:
        mod.clear()
