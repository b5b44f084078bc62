"""Which kernel serves this call on this device: the one place that decides.

Key: (family, device arch, axis values). The first call builds or loads the module; later
calls are a dict lookup.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from functools import cache

from .build import module_path
from .build.jit import compile_variant, evict_module
from .families import get as get_family
from .render import symbol
from .spec import Variant, load_family, make_variant, validate
from .targets import device_arch, get_target


class Unsupported(ValueError):
    """The call is valid Python but no kernel exists for it on this device."""


_lock = threading.Lock()
_loaded: dict[Variant, ctypes._CFuncPtr] = {}


@cache
def arch_of(device_index: int) -> str:
    import torch

    return device_arch(torch.device("cuda", device_index))


def variant_for(family: str, arch: str, **params) -> Variant:
    """The variant serving these parameters on arch, or Unsupported saying why not."""
    try:
        target = get_target(arch)
    except ValueError as e:
        raise Unsupported(f"device arch: {e}") from None
    fam = load_family(family)
    if any(a.name == "fp8" for a in fam.axes) and "fp8" not in params:
        if not target.has_fp8:
            raise Unsupported(f"arch {arch} has no FP8 support; {family} is not offered there")
        params["fp8"] = target.fp8_format(params.pop("fp8_max", None)).token
    params.pop("fp8_max", None)
    v = make_variant(family, arch, **params)
    reason = validate(v)
    if reason:
        raise Unsupported(f"{v.uri} on {arch}: {reason}")
    return v


def _load(variant: Variant):
    """The variant's module, loaded; one that fails to load is evicted and built again, once."""
    path = module_path(variant)
    try:
        return ctypes.PyDLL(str(path))
    except OSError as e:
        print(f"codegen: {path} does not load ({e}); building {variant.uri} again",
              file=sys.stderr)
        evict_module(variant, path)
        return ctypes.PyDLL(str(compile_variant(variant, loadable=True)))


def kernel(variant: Variant):
    """The launcher of a variant, loaded once per process."""
    fn = _loaded.get(variant)
    if fn is not None:
        return fn
    with _lock:
        fn = _loaded.get(variant)
        if fn is None:
            # PyDLL: the launchers only enqueue work, so the GIL stays held (as torch holds it
            # around its own launches) instead of being released and taken back per call.
            lib = _load(variant)
            fn = getattr(lib, symbol(variant))
            fn.argtypes = get_family(variant.family).ARGTYPES
            fn.restype = ctypes.c_int
            _loaded[variant] = fn
    return fn
