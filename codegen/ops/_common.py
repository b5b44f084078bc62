"""Argument checks and launch helpers shared by the ops."""
from __future__ import annotations

import torch

from ..dispatch import arch_of, kernel, variant_for

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


def stream(t: torch.Tensor) -> int:
    dev = t.get_device()
    return raw_stream(dev) if dev >= 0 else 0


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
