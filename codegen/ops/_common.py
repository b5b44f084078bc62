"""Argument checks and launch helpers shared by the ops."""
from __future__ import annotations

import torch

from ..dispatch import arch_of as _arch_of
from ..dispatch import kernel, variant_for

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
LIB = torch.library.Library("codegen", "DEF")

# Host (CPU) tensors run on an emulated AMD GPU while one is attached (codegen.emu.attach): an
# object with .arch, .multiprocessors and .kernel(variant) -> launcher. Every per-device cache
# of the ops is in CACHES, so that attaching another device starts them afresh.
emulated = None
CACHES: list[dict | set] = []


def attach_emulated(device) -> None:
    global emulated
    emulated = device
    for c in CACHES:
        c.clear()
    from . import _fast
    _fast.clear()


def on_emulator(t: torch.Tensor) -> bool:
    return emulated is not None and t.device.type == "cpu"


def check_tensor(name: str, t: torch.Tensor, dtypes=tuple(DTYPE_NAMES), ndim: int | None = None,
                 any_strides: bool = False):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {t.dtype} not supported; expected one of "
                        f"{[str(d) for d in dtypes]}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if t.device.type != "cuda" and not on_emulator(t):
        raise ValueError(f"{name}: must be on a GPU (cuda/hip device), got device {t.device}")
    if not any_strides and t.dim() and t.stride(-1) != 1 and t.numel() > 1:
        raise ValueError(f"{name}: last dim must be contiguous (stride 1), got strides {t.stride()}")


def check_out(out, x: torch.Tensor, dtype: torch.dtype, name: str = "out") -> None:
    """out, an output the caller gives: x's shape and device, dtype, contiguous."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != dtype or out.device != x.device:
        raise ValueError(f"{name}: {tuple(out.shape)} {out.dtype} on {out.device}, expected "
                         f"{tuple(x.shape)} {dtype} on {x.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name}: must be contiguous, got strides {out.stride()}")


def rows_aligned(t: torch.Tensor) -> bool:
    """Every row (or the one vector) of t starts on a 16-byte boundary."""
    if t.data_ptr() % 16:
        return False
    return t.dim() == 1 or t.shape[0] <= 1 or (t.stride(0) * t.element_size()) % 16 == 0


def aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """t itself if its rows are 16-byte aligned, else a fresh contiguous copy (which is): the
    kernels read rows 16 bytes at a time."""
    return t if rows_aligned(t) else t.clone(memory_format=torch.contiguous_format)


# Fixed for a device while the process lives: torch.compile takes the value when it traces a call
# rather than tracing into the function's cache (which it warns about).
@torch.compiler.assume_constant_result
def arch_of(device_index: int) -> str:
    return _arch_of(device_index)


def arch(t: torch.Tensor) -> str:
    if on_emulator(t):
        return emulated.arch
    return arch_of(t.device.index if t.device.index is not None else torch.cuda.current_device())


def multiprocessors(t: torch.Tensor) -> int:
    """CUs (HIP's multiprocessors) or SMs of t's device."""
    if on_emulator(t):
        return emulated.multiprocessors
    return torch.cuda.get_device_properties(t.device).multi_processor_count


# bound once: the eager paths call them on every launch
is_compiling = torch.compiler.is_compiling
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0)
_get_device = getattr(torch._C, "_cuda_getDevice", lambda: -1)
_set_device = getattr(torch._C, "_cuda_setDevice", None)


def launch(fn, t: torch.Tensor, *args) -> int:
    """fn(*args, stream) on t's device and its current stream, that device made current for
    the call (as torch's own ops do: a launch goes to the current device, whatever its
    pointers)."""
    dev = t.get_device()
    if dev < 0:
        return fn(*args, 0)
    prev = _get_device()
    if prev == dev:
        return fn(*args, raw_stream(dev))
    _set_device(dev)
    try:
        return fn(*args, raw_stream(dev))
    finally:
        _set_device(prev)


def check_written(name: str, t: torch.Tensor, in_place: str | None = None, **others) -> None:
    """t, which a kernel writes, shares no memory with the operands in others (None: absent),
    except the one named in_place, which it may be exactly: the kernels read and write rows in
    no particular order."""
    traced = is_compiling()
    for other, o in others.items():
        if o is None:
            continue
        if traced:    # traced tensors have no addresses: only the same tensor is told
            if t is not o or other == in_place:
                continue
        elif not overlap(t, o) or (other == in_place and t.data_ptr() == o.data_ptr()
                                   and t.stride() == o.stride() and t.shape == o.shape):
            continue
        must = f"be {in_place} itself or " if in_place else ""
        raise ValueError(f"{name}: overlaps {other}; it must {must}share no memory with the "
                         f"other operands")


def _rows_of(t: torch.Tensor) -> tuple[int, int, int, int]:
    """(first byte, rows, row stride, row length) in bytes of a [T, H] or [H] operand."""
    es = t.element_size()
    if t.dim() == 1:
        return t.data_ptr(), 1, 0, ((t.shape[0] - 1) * t.stride(0) + 1) * es
    rows, h = t.shape
    return t.data_ptr(), rows, t.stride(0) * es, ((h - 1) * t.stride(1) + 1) * es


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two [T, H] / [H] operands share a byte: exact for rows of one stride (columns
    of one buffer side by side), by the spans they cover otherwise."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    pa, ra, sa, wa = _rows_of(a)
    pb, rb, sb, wb = _rows_of(b)
    if pa + (ra - 1) * sa + wa <= pb or pb + (rb - 1) * sb + wb <= pa:
        return False
    s = sb if ra == 1 else sa          # a single row has no stride of its own
    if rb > 1 and sb != s or s <= 0:
        return True
    # row i of a and row j of b meet where d - wa < (i - j) * s < d + wb
    d = pb - pa
    k = max((d - wa) // s + 1, 1 - rb)
    return k <= ra - 1 and k * s < d + wb


def check_rc(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: kernel launch failed with GPU runtime error {rc}")


_launchers: dict[tuple, tuple] = {}
CACHES.append(_launchers)


def launcher(family: str, x: torch.Tensor, **params):
    """(launcher, uri) of the variant serving these parameters on x's device, cached."""
    key = (family, x.get_device(), *params.items())   # x is a checked GPU tensor
    hit = _launchers.get(key)
    if hit is None:
        v = variant_for(family, arch(x), **params)
        hit = _launchers[key] = (emulated.kernel(v) if on_emulator(x) else kernel(v), v.uri)
    return hit
