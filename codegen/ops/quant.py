"""per_token_group_quant_fp8: FP8 quantization with one fp32 scale per group of G values."""
from __future__ import annotations

import numbers

import torch

from ..dispatch import Unsupported
from ..families import quant as fam
from ..targets import get_target
from . import _fast
from ._common import aligned_copy, check_out as check_any_out, check_written
from ._common import (CACHES, DTYPE_NAMES, LIB, arch, check_rc, check_tensor, is_compiling as
                      _is_compiling, launch, launcher)

SCALE_LAYOUTS = ("row", "col", "col_tma")
GROUP_SIZES = (32, 64, 128)


def scale_col_stride(t: int, layout: str) -> int:
    """Column stride of column-major scales: T, or T rounded up to 4 (TMA-aligned)."""
    return t if layout == "col" else (t + 3) // 4 * 4


def empty_scales(t: int, groups: int, layout: str, like: torch.Tensor) -> torch.Tensor:
    """fp32 [T, groups] scales with the layout's real strides, on like's device."""
    if layout == "row":
        return like.new_empty((t, groups), dtype=torch.float32)
    stride = scale_col_stride(t, layout)
    return like.new_empty((groups, stride), dtype=torch.float32)[:, :t].t()


LIB.define("per_token_group_quant_fp8(Tensor x, int group_size, str scale_layout, bool ue8m0, "
           "float fp8_max, ScalarType fp8_dtype) -> (Tensor, Tensor)")


@torch.library.register_fake("codegen::per_token_group_quant_fp8")
def _fake(x, group_size, scale_layout, ue8m0, fp8_max, fp8_dtype):
    t, h = x.shape
    q = x.new_empty((t, h), dtype=fp8_dtype)
    return q, empty_scales(t, h // group_size, scale_layout, x)


def _launch(x, group_size, scale_layout, ue8m0, fp8_max, fp8_dtype, kernel, out=None):
    x = aligned_copy(x)
    t, h = x.shape
    q = x.new_empty((t, h), dtype=fp8_dtype) if out is None else out
    s = empty_scales(t, h // group_size, scale_layout, x)
    if t == 0 or h == 0:
        return q, s
    fn, uri = kernel
    groups = h // group_size
    rc = launch(fn, x, x.data_ptr(), q.data_ptr(), s.data_ptr(), t * groups, groups,
                x.stride(0) * x.element_size(), scale_col_stride(t, scale_layout),
                fam.GRID_WAVES)
    if rc:
        check_rc(rc, uri)
    return q, s


def _kernel(x, group_size, scale_layout, ue8m0, fp8_max):
    return launcher("group_quant_fp8", x, dtype=DTYPE_NAMES[x.dtype], group_size=group_size,
                    scale_layout=scale_layout, ue8m0=ue8m0, fp8_max=fp8_max)


def _impl(x, group_size, scale_layout, ue8m0, fp8_max, fp8_dtype):
    """torch.ops.codegen.per_token_group_quant_fp8, checked as the op checks (a direct call has
    had no other check; a compiled graph's, one per signature)."""
    _, fmax, kern = _plan(x, group_size, scale_layout, ue8m0, fp8_dtype, fp8_max)
    return _launch(x, group_size, scale_layout, ue8m0, fmax, fp8_dtype, kern)


LIB.impl("per_token_group_quant_fp8", _impl, "CUDA")


_fp8_cache: dict[tuple, tuple[torch.dtype, float]] = {}
CACHES.append(_fp8_cache)


def resolve_fp8(x: torch.Tensor, fp8_dtype, fp8_max, name: str = "x"
                ) -> tuple[torch.dtype, float]:
    """The FP8 dtype and max for x's device: the target's default unless asked otherwise."""
    key = (x.device.index, fp8_dtype, fp8_max)
    hit = _fp8_cache.get(key)
    if hit:
        return hit
    try:
        target = get_target(arch(x))
    except ValueError as e:
        raise Unsupported(f"{name}: device arch not supported: {e}") from None
    if not target.has_fp8:
        raise Unsupported(f"{name}: arch {target.arch} has no FP8 support")
    try:
        fmt = target.fp8_format(fp8_max)
    except ValueError as e:
        raise ValueError(f"fp8_max: {e}") from None
    dtype = getattr(torch, fmt.torch_dtype)
    if fp8_dtype is not None and fp8_dtype != dtype:
        raise ValueError(f"fp8_dtype: {fp8_dtype} is not the FP8 format of arch {target.arch} "
                         f"({dtype})")
    if not _is_compiling():      # a cache written while tracing would force a second graph
        _fp8_cache[key] = (dtype, fmt.max)
    return dtype, fmt.max


def check_group_type(group_size) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral):
        raise TypeError(f"group_size: expected an int, got {type(group_size).__name__}")


def check_flag(name: str, value) -> None:
    """A bool argument: a string such as "no" would otherwise read as True."""
    if value is not True and value is not False and (isinstance(value, str) or value not in (0, 1)):
        raise TypeError(f"{name}: expected a bool, got {value!r}")


def check_group(h: int, group_size: int, scale_layout: str, name: str = "x") -> None:
    """group_size and scale_layout, for rows of h values of the argument `name`."""
    check_group_type(group_size)
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size: {group_size} not supported; expected one of {GROUP_SIZES}")
    if h % group_size:
        raise ValueError(f"{name}: hidden size {h} is not a multiple of group_size={group_size}")
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout: {scale_layout!r}; expected one of {SCALE_LAYOUTS}")


def check_out(out, x: torch.Tensor, dtype: torch.dtype, name: str = "out") -> None:
    """out, the caller's q: as any op's out, and 16-byte aligned on eager calls."""
    check_any_out(out, x, dtype, name)
    if not _is_compiling():     # traced calls copy into out
        if out.data_ptr() % 16:
            raise ValueError(f"{name}: must start on a 16-byte boundary (the kernels store rows "
                             f"in 8-byte pieces from there)")
        check_written(name, out, x=x)


def _check(x, group_size, scale_layout, fp8_dtype, fp8_max) -> tuple[torch.dtype, float]:
    """Everything but T and out: x, the groups, the FP8 format."""
    check_tensor("x", x, ndim=2)
    check_group(x.shape[1], group_size, scale_layout)
    return resolve_fp8(x, fp8_dtype, fp8_max)


_plans: dict[tuple, tuple] = {}
CACHES.append(_plans)


def _plan(x, group_size, scale_layout, ue8m0, fp8_dtype, fp8_max) -> tuple:
    """(FP8 dtype, FP8 max, (launcher, uri)): everything but T checked, and the kernel built or
    loaded (JIT), once per plan key."""
    try:
        key = (x.dtype, x.get_device(), x.dim(), x.shape[-1], x.stride(-1), min(len(x), 2),
               group_size, scale_layout, ue8m0, fp8_dtype, fp8_max)
        plan = _plans.get(key)
    except (AttributeError, TypeError, IndexError):     # not a tensor, 0-d, unhashable
        key = plan = None
    if plan is None:
        dtype, fmax = _check(x, group_size, scale_layout, fp8_dtype, fp8_max)
        plan = (dtype, fmax, _kernel(x, group_size, scale_layout, bool(ue8m0), fmax))
        if key is not None:
            _plans[key] = plan
    return plan


def per_token_group_quant_fp8(x: torch.Tensor, group_size: int = 128, *,
                              scale_layout: str = "row", ue8m0: bool = False,
                              fp8_dtype: torch.dtype | None = None,
                              fp8_max: float | None = None,
                              out: torch.Tensor | None = None
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [T, H] (bf16/fp16/fp32, last dim contiguous, rows may be strided) to FP8.

    Returns (q [T, H] fp8, scales fp32 [T, H/G]) with x ~= q * scales per group; q is out
    where given (x's shape and device, the FP8 dtype, contiguous).
    scale_layout: "row" (row-major), "col" (column-major, strides (1, T)) or "col_tma"
    (column-major, T padded to a multiple of 4: strides (1, round_up(T, 4))).
    ue8m0: round each scale up to a power of two. fp8_dtype / fp8_max: default to the device's
    format (e4m3fnuz / 224 on gfx942, where 240 is also offered; e4m3fn / 448 elsewhere).
    """
    if type(ue8m0) is not bool:
        check_flag("ue8m0", ue8m0)
    if _is_compiling():      # checked in full; no cache written while tracing (a recompile)
        dtype, fmax = _check(x, group_size, scale_layout, fp8_dtype, fp8_max)
        if out is not None:
            check_out(out, x, dtype)
        q, s = torch.ops.codegen.per_token_group_quant_fp8(x, group_size, scale_layout,
                                                           bool(ue8m0), fmax, dtype)
        return (q, s) if out is None else (out.copy_(q), s)
    if type(group_size) is not int:     # 128.0 and 128 hash alike: a plan's key would take either
        check_group_type(group_size)
    params = (group_size, scale_layout, ue8m0, fp8_dtype, fp8_max)
    res = _fast.call("quant", params, x, out)    # the C++ path, where the signature has a plan
    if res is not None:
        return res
    dtype, fmax, kern = _plan(x, group_size, scale_layout, ue8m0, fp8_dtype, fp8_max)
    if out is not None:
        check_out(out, x, dtype)
    q, s = _launch(x, group_size, scale_layout, ue8m0, fmax, dtype, kern, out)   # eager
    _fast.keep(_fast.QUANT, params, (x,), kern, dtype,
               (x.shape[1] // group_size, _fast.LAYOUTS[scale_layout], fam.GRID_WAVES))
    return q, s
