"""RMSNorm ops (docs/numerics.md, "RMSNorm family"): rmsnorm, fused_add_rmsnorm,
rmsnorm_group_quant, dual_rmsnorm_group_quant.

Every row is normalized by the same code (templates/include/codegen/rmsnorm.cuh) with a sum
order that depends only on H and the device, so the fused ops agree bit for bit with the unfused
ones composed: rmsnorm_group_quant(x) == per_token_group_quant_fp8(rmsnorm(x.float(),
w.float())), and dual_rmsnorm_group_quant == rmsnorm_group_quant(q) + rmsnorm(kv).
"""
from __future__ import annotations

import numbers

import torch

from ..families.dual_rmsnorm_quant import max_h
from ..targets import get_target
from . import _fast
from ._common import aligned_copy as _aligned_copy
from ._common import rows_aligned as _rows_aligned
from ._common import (CACHES, DTYPE_NAMES, LIB, arch, check_out, check_rc, check_tensor,
                      check_written, is_compiling as _is_compiling, launch, launcher)
from .quant import check_flag, check_group, check_group_type, empty_scales, resolve_fp8


@torch.compiler.assume_constant_result    # as arch_of (ops/_common.py)
def dual_max_h(dtype: str, wave: int) -> int:
    return max_h(dtype, wave)


QUANT_DTYPES = (torch.bfloat16, torch.float16)
MAX_H = 1 << 24          # H as a float is exact, byte offsets within a row fit in 32 bits
MAX_T = (1 << 31) - 1
FLT_MAX = 3.4028234663852886e38

def _row_stride_bytes(t: torch.Tensor) -> int:
    return t.stride(0) * t.element_size() if t.shape[0] > 1 else t.shape[1] * t.element_size()


# ---- argument checks (shape, dtype and device only: they also run on fake tensors) ----

def _check_rows(name: str, t, dtypes) -> None:
    check_tensor(name, t, dtypes, ndim=2)
    rows, h = t.shape
    if h == 0:
        raise ValueError(f"{name}: hidden size must be > 0, got shape {tuple(t.shape)}")
    if h > MAX_H:
        raise ValueError(f"{name}: hidden size {h} exceeds {MAX_H}")
    if rows > MAX_T:
        raise ValueError(f"{name}: {rows} rows exceed {MAX_T}")
    if t.stride(0) < h and rows > 1:    # the stride first: T may be unknown while tracing
        raise ValueError(f"{name}: row stride {t.stride(0)} is smaller than the hidden size {h} "
                         f"(rows would overlap)")


def _check_like(name: str, t, ref, ref_name: str, ndim: int) -> None:
    """t has ref's dtype and device (a weight: ndim 1; a residual: ndim 2)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != ref.dtype:
        raise TypeError(f"{name}: dtype {t.dtype} must match {ref_name} ({ref.dtype})")
    check_tensor(name, t, (ref.dtype,), ndim=ndim)
    if t.device != ref.device:
        raise ValueError(f"{name}: on {t.device}, but {ref_name} is on {ref.device}")


def _check_weight(name: str, w, x, x_name: str) -> None:
    _check_like(name, w, x, x_name, 1)
    if w.shape[0] != x.shape[1]:
        raise ValueError(f"{name}: shape {tuple(w.shape)} does not match the hidden size "
                         f"{x.shape[1]} of {x_name}")


def _check_residual(residual, x, name: str = "residual") -> None:
    _check_like(name, residual, x, "x", 2)
    if residual.shape != x.shape:
        raise ValueError(f"{name}: shape {tuple(residual.shape)} must match x "
                         f"{tuple(x.shape)}")
    if residual.stride(0) < residual.shape[1] and residual.shape[0] > 1:
        raise ValueError(f"{name}: row stride {residual.stride(0)} is smaller than the hidden "
                         f"size {residual.shape[1]} (rows would overlap)")


def _check_residuals(residual, residual_out, x) -> None:
    _check_residual(residual, x)
    if residual_out is not None:
        _check_residual(residual_out, x, "residual_out")


def _check_writes(x, weight, residual, residual_out, out=None) -> None:
    """out (where given) is x itself or apart from every other operand; the residual sum goes
    into residual_out (residual itself, or apart from it), else into residual: apart from x and
    weight either way."""
    if out is not None:
        check_written("out", out, "x", x=x, weight=weight, residual=residual,
                      residual_out=residual_out)
    if residual_out is not None:
        check_written("residual_out", residual_out, "residual", residual=residual, x=x,
                      weight=weight)
    elif residual is not None:
        check_written("residual", residual, x=x, weight=weight)


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
    value = float(eps)
    if not 0 <= value <= FLT_MAX:     # NaN fails too; no math.isfinite: it cannot be traced
        raise ValueError(f"eps: must be >= 0 and finite in fp32 (the kernels' eps), got {eps}")
    return value


def _check_aligned_residual(residual: torch.Tensor, name: str = "residual") -> None:
    if not _rows_aligned(residual):
        raise ValueError(f"{name}: rows must start on 16-byte boundaries for the fused quant "
                         f"kernel (data_ptr % 16 = {residual.data_ptr() % 16}, row stride "
                         f"{residual.stride(0)} elements)")


# ---- per-signature plans ----
# The checks that read neither T nor the data run once per call signature (dtypes, devices,
# sizes past the rows, strides, whether there are 0, 1 or more rows, parameters) and their
# result is kept, with the kernels loaded for it; the T-dependent ones run on every call. Not
# while torch.compile traces (sizes may be symbolic there): the checks then run in full.
class _Plan:
    __slots__ = ("value", "kernels")

    def __init__(self, value, kernels: dict | None):
        self.value = value        # check()'s result
        self.kernels = kernels    # (launcher, uri) by what the signature leaves open, or None


_plans: dict[tuple, _Plan] = {}
CACHES.append(_plans)


def _signature(t: torch.Tensor | None) -> tuple | None:
    # rows as 0, 1 or more: the row stride and last-dim stride checks depend on that alone.
    # get_device() is -1 off the GPU, where the checks fail and nothing is kept.
    if t is None:
        return None
    return (t.dtype, t.get_device(), t.shape[-1], t.stride(), min(t.shape[0], 2))


def _planned(params: tuple, tensors: tuple, check) -> _Plan:
    """check()'s result, computed once per (params, signatures of tensors)."""
    try:
        key = (params, *map(_signature, tensors))
        hit = _plans.get(key)
    except (AttributeError, TypeError, IndexError):   # not tensors, 0-d, unhashable: no plan
        return _Plan(check(), None)
    if hit is None:
        hit = _plans[key] = _Plan(check(), {})
    return hit


def _kernel(kernels: dict | None, open_params, family: str, x: torch.Tensor, **params):
    """(launcher, uri) of the variant, kept in the plan under what its signature leaves open."""
    hit = kernels.get(open_params) if kernels is not None else None
    if hit is None:
        hit = launcher(family, x, **params)
        if kernels is not None:
            kernels[open_params] = hit
    return hit


def _check_row_count(name: str, t: torch.Tensor) -> None:
    if t.shape[0] > MAX_T:
        raise ValueError(f"{name}: {t.shape[0]} rows exceed {MAX_T}")


def _check_residual_rows(x, residual, residual_out) -> None:
    """What a plan leaves to each call: the residuals have x's rows."""
    if residual is not None and (residual.shape[0] != x.shape[0] or (
            residual_out is not None and residual_out.shape[0] != x.shape[0])):
        _check_residuals(residual, residual_out, x)


# Each op's checks but those of T, and their result (a plan's value). fp8_dtype: None from the
# ops (the device's), the schema's from the registered ones.

def _check_rmsnorm(x, weight, eps) -> float:
    _check_rows("x", x, tuple(DTYPE_NAMES))
    _check_weight("weight", weight, x, "x")
    return _check_eps(eps)


def _check_fused_add(x, residual, weight, eps, residual_out) -> float:
    _check_rows("x", x, tuple(DTYPE_NAMES))
    _check_residuals(residual, residual_out, x)
    _check_weight("weight", weight, x, "x")
    return _check_eps(eps)


def _check_rgq(x, weight, residual, residual_out, eps, group_size, scale_layout, fp8_max,
               fp8_dtype=None) -> tuple:
    _check_rows("x", x, QUANT_DTYPES)
    _check_weight("weight", weight, x, "x")
    if residual is not None:
        _check_residuals(residual, residual_out, x)
    elif residual_out is not None:
        raise ValueError("residual_out: given without residual")
    check_group(x.shape[1], group_size, scale_layout, "x")
    return (_check_eps(eps), *resolve_fp8(x, fp8_dtype, fp8_max))


def _check_dual(q, q_weight, kv, kv_weight, eps, group_size, scale_layout, fp8_max,
                fp8_dtype=None) -> tuple:
    _check_rows("q", q, QUANT_DTYPES)
    _check_weight("q_weight", q_weight, q, "q")
    _check_rows("kv", kv, QUANT_DTYPES)
    if kv.dtype != q.dtype or kv.device != q.device:
        raise TypeError(f"kv: {kv.dtype} on {kv.device} must match q ({q.dtype} on "
                        f"{q.device})")
    _check_dual_rows(q, kv)
    _check_weight("kv_weight", kv_weight, kv, "kv")
    check_group(q.shape[1], group_size, scale_layout, "q")
    if kv.shape[1] % 8:
        raise ValueError(f"kv: hidden size {kv.shape[1]} is not a multiple of 8")
    eps, dtype, fmax = (_check_eps(eps), *resolve_fp8(q, fp8_dtype, fp8_max, "q"))
    wave = get_target(arch(q)).wave_size     # known: resolve_fp8 has read the arch
    for name, t in (("q", q), ("kv", kv)):
        limit = dual_max_h(DTYPE_NAMES[t.dtype], wave)
        if t.shape[1] > limit:
            raise ValueError(f"{name}: hidden size {t.shape[1]} exceeds {limit}, the longest "
                             f"row dual_rmsnorm_group_quant holds; use rmsnorm_group_quant "
                             f"and rmsnorm")
    return eps, dtype, fmax


def _check_dual_rows(q, kv) -> None:
    if kv.shape[0] != q.shape[0]:
        raise ValueError(f"kv: {kv.shape[0]} rows, but q has {q.shape[0]}")


# ---- rmsnorm / fused_add_rmsnorm ----

LIB.define("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor")
LIB.define("fused_add_rmsnorm(Tensor x, Tensor(a!) residual, Tensor weight, float eps, "
           "Tensor(b!)? residual_out=None) -> Tensor")


@torch.library.register_fake("codegen::rmsnorm")
def _rmsnorm_fake(x, weight, eps):
    return x.new_empty(x.shape)


@torch.library.register_fake("codegen::fused_add_rmsnorm")
def _fused_add_fake(x, residual, weight, eps, residual_out=None):
    return x.new_empty(x.shape)


def _norm(x, residual, weight, eps, kernels=None, out=None, record=None, residual_out=None):
    t, h = x.shape
    y = x.new_empty((t, h)) if out is None else out
    if t == 0:
        return y
    _check_writes(x, weight, residual, residual_out, out)
    # 16-byte accesses when every row of every operand starts on a 16-byte boundary
    vector = (h * x.element_size()) % 16 == 0 and _rows_aligned(x) and _rows_aligned(weight) \
        and _rows_aligned(y) and (residual is None or _rows_aligned(residual)) \
        and (residual_out is None or _rows_aligned(residual_out))
    hit = kernels.get(vector) if kernels is not None else None
    fn, uri = hit or _kernel(kernels, vector, "rmsnorm", x, dtype=DTYPE_NAMES[x.dtype],
                             residual=residual is not None, load="vec16" if vector else "scalar")
    rc = launch(fn, x, x.data_ptr(), None if residual is None else residual.data_ptr(),
                None if residual_out is None else residual_out.data_ptr(), weight.data_ptr(),
                y.data_ptr(), t, h, _row_stride_bytes(x),
                0 if residual is None else _row_stride_bytes(residual),
                0 if residual_out is None else _row_stride_bytes(residual_out), eps)
    if rc:
        check_rc(rc, uri)
    if record is not None and vector:
        _fast.keep(_fast.NORM, record, (x, residual, weight, residual_out), (fn, uri), x.dtype,
                   (), eps)
    return y


# The registered implementations check as the ops do: a direct torch.ops call has had no other
# check, and a compiled graph's calls take the plan of their signature.

def _rmsnorm_impl(x, weight, eps):
    plan = _planned(("rmsnorm", eps), (x, weight), lambda: _check_rmsnorm(x, weight, eps))
    _check_row_count("x", x)
    return _norm(x, None, weight, plan.value, plan.kernels)


def _fused_add_impl(x, residual, weight, eps, residual_out=None):
    plan = _planned(("fused_add_rmsnorm", eps), (x, residual, weight, residual_out),
                    lambda: _check_fused_add(x, residual, weight, eps, residual_out))
    _check_row_count("x", x)
    _check_residual_rows(x, residual, residual_out)
    return _norm(x, residual, weight, plan.value, plan.kernels, residual_out=residual_out)


LIB.impl("rmsnorm", _rmsnorm_impl, "CUDA")
LIB.impl("fused_add_rmsnorm", _fused_add_impl, "CUDA")


def _into(out, y):
    """Under torch.compile the op returns a new tensor: copied into out when one was given."""
    if out is None:
        return y
    check_out(out, y, y.dtype)
    return out.copy_(y)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """y = dtype(x * rsqrt(mean(x^2) + eps) * weight), computed in fp32, rounded once.

    x: [T, H] bf16/fp16/fp32, last dim contiguous, any row stride >= H; weight: [H], x's dtype.
    Returns y [T, H] contiguous (written into out if given: contiguous, x's shape and dtype;
    out may be x itself).
    """
    def check():
        return _check_rmsnorm(x, weight, eps)
    if _is_compiling():
        return _into(out, torch.ops.codegen.rmsnorm(x, weight, check()))
    if type(eps) is not float:     # 1.0 and True hash alike: a plan's key would take either
        _check_eps(eps)
    y = _fast.call("norm", ("rmsnorm", eps), x, None, weight, None, out)
    if y is not None:
        return y
    plan = _planned(("rmsnorm", eps), (x, weight), check)
    _check_row_count("x", x)
    if out is not None:
        check_out(out, x, x.dtype)
    return _norm(x, None, weight, plan.value, plan.kernels, out,
                 ("rmsnorm", eps) if plan.kernels is not None else None)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6, *, out: torch.Tensor | None = None,
                      residual_out: torch.Tensor | None = None) -> torch.Tensor:
    """r = dtype(x + residual) is written into residual (in place), or into residual_out if
    given (residual then only read); returns rmsnorm(r, weight).

    x, residual, residual_out: [T, H] of one dtype (bf16/fp16/fp32), last dim contiguous, any
    row stride >= H; residual_out is residual itself or shares no memory with x, residual,
    weight or out (ValueError). weight: [H]. out: as rmsnorm's (x itself for vLLM's in-place
    convention).
    """
    def check():
        return _check_fused_add(x, residual, weight, eps, residual_out)
    if _is_compiling():
        eps = check()
        _check_writes(x, weight, residual, residual_out, out)
        return _into(out, torch.ops.codegen.fused_add_rmsnorm(x, residual, weight, eps,
                                                              residual_out))
    if type(eps) is not float:
        _check_eps(eps)
    y = _fast.call("norm", ("fused_add_rmsnorm", eps), x, residual, weight, residual_out, out)
    if y is not None:
        return y
    plan = _planned(("fused_add_rmsnorm", eps), (x, residual, weight, residual_out), check)
    _check_row_count("x", x)
    _check_residual_rows(x, residual, residual_out)
    if out is not None:
        check_out(out, x, x.dtype)
    return _norm(x, residual, weight, plan.value, plan.kernels, out,
                 ("fused_add_rmsnorm", eps) if plan.kernels is not None else None, residual_out)


# ---- rmsnorm_group_quant ----

LIB.define("rmsnorm_group_quant(Tensor x, Tensor weight, Tensor(a!)? residual, float eps, "
           "int group_size, str scale_layout, bool ue8m0, bool also_return_unquantized, "
           "float fp8_max, ScalarType fp8_dtype, Tensor(b!)? residual_out=None) -> "
           "(Tensor, Tensor, Tensor)")


def _quant_outputs(x, group_size, scale_layout, fp8_dtype):
    t, h = x.shape
    q = x.new_empty((t, h), dtype=fp8_dtype)
    return q, empty_scales(t, h // group_size, scale_layout, x)


@torch.library.register_fake("codegen::rmsnorm_group_quant")
def _rgq_fake(x, weight, residual, eps, group_size, scale_layout, ue8m0, also_return_unquantized,
              fp8_max, fp8_dtype, residual_out=None):
    t, h = x.shape
    q = x.new_empty((t, h), dtype=fp8_dtype)
    s = empty_scales(t, h // group_size, scale_layout, x)
    y = x.new_empty((t if also_return_unquantized else 0, h))
    return q, s, y


def _rgq_launch(x, weight, residual, eps, group_size, scale_layout, ue8m0, y, fp8_max, fp8_dtype,
                kernels=None, record=None, residual_out=None):
    """(q, scales); y: None, or [T, H] of x's dtype for the normalized values. record: the
    call's parameters, to keep its plan for the C++ path (rows aligned, no y)."""
    q, s = _quant_outputs(x, group_size, scale_layout, fp8_dtype)
    t, h = x.shape
    if t == 0:
        return q, s
    if residual_out is not None:
        _check_aligned_residual(residual_out, "residual_out")
    elif residual is not None:
        _check_aligned_residual(residual)
    _check_writes(x, weight, residual, residual_out)
    if record is not None and y is None and _rows_aligned(x) and _rows_aligned(weight):
        keep = (x, weight, residual, residual_out)
    else:
        keep = None
    x, weight = _aligned_copy(x), _aligned_copy(weight)
    if residual_out is not None:      # only read
        residual = _aligned_copy(residual)
    hit = kernels.get(ue8m0) if kernels is not None else None
    fn, uri = hit or _kernel(kernels, ue8m0, "rmsnorm_group_quant", x,
                             dtype=DTYPE_NAMES[x.dtype], group_size=group_size, ue8m0=ue8m0,
                             residual=residual is not None, fp8_max=fp8_max)
    rc = launch(fn, x, x.data_ptr(), None if residual is None else residual.data_ptr(),
                None if residual_out is None else residual_out.data_ptr(), weight.data_ptr(),
                q.data_ptr(), s.data_ptr(), None if y is None else y.data_ptr(), t, h,
                _row_stride_bytes(x), 0 if residual is None else _row_stride_bytes(residual),
                0 if residual_out is None else _row_stride_bytes(residual_out), s.stride(0),
                s.stride(1), eps)
    check_rc(rc, uri)
    if keep is not None:
        _fast.keep(_fast.NORM_QUANT, record, keep, (fn, uri), fp8_dtype,
                (h // group_size, _fast.LAYOUTS[scale_layout], 0), eps)
    return q, s


def _rgq_impl(x, weight, residual, eps, group_size, scale_layout, ue8m0, also_return_unquantized,
              fp8_max, fp8_dtype, residual_out=None):
    plan = _planned(("rmsnorm_group_quant", eps, group_size, scale_layout, fp8_max, fp8_dtype),
                    (x, weight, residual, residual_out),
                    lambda: _check_rgq(x, weight, residual, residual_out, eps, group_size,
                                       scale_layout, fp8_max, fp8_dtype))
    eps, fp8_dtype, fp8_max = plan.value
    _check_row_count("x", x)
    _check_residual_rows(x, residual, residual_out)
    y = x.new_empty((x.shape[0] if also_return_unquantized else 0, x.shape[1]))
    q, s = _rgq_launch(x, weight, residual, eps, group_size, scale_layout, bool(ue8m0),
                       y if also_return_unquantized else None, fp8_max, fp8_dtype,
                       plan.kernels, residual_out=residual_out)
    return q, s, y


LIB.impl("rmsnorm_group_quant", _rgq_impl, "CUDA")


def rmsnorm_group_quant(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                        group_size: int = 128, *, residual: torch.Tensor | None = None,
                        residual_out: torch.Tensor | None = None,
                        scale_layout: str = "row", ue8m0: bool = False,
                        also_return_unquantized: bool = False, fp8_max: float | None = None):
    """RMSNorm, then per-token-group FP8 quant of the fp32 normalized values, in one kernel.

    x: [T, H] bf16/fp16 (H % group_size == 0), last dim contiguous; weight: [H].
    residual: optional [T, H]; if given, r = dtype(x + residual) is written into it (in place,
    its rows 16-byte aligned), or into residual_out if given (as fused_add_rmsnorm's; its rows
    16-byte aligned), and r is normalized instead of x.
    Returns (q [T, H] fp8, scales fp32 [T, H/G] in scale_layout: "row", "col" or "col_tma"
    as per_token_group_quant_fp8), plus y [T, H] (dtype(normalized)) if also_return_unquantized.
    ue8m0: power-of-two scales. fp8_max: as per_token_group_quant_fp8 (device default).
    """
    if type(ue8m0) is not bool or type(also_return_unquantized) is not bool:
        check_flag("ue8m0", ue8m0)
        check_flag("also_return_unquantized", also_return_unquantized)

    def check():
        return _check_rgq(x, weight, residual, residual_out, eps, group_size, scale_layout,
                          fp8_max)
    if _is_compiling():
        eps, fp8_dtype, fmax = check()
        _check_writes(x, weight, residual, residual_out)
        q, s, y = torch.ops.codegen.rmsnorm_group_quant(
            x, weight, residual, eps, group_size, scale_layout, bool(ue8m0),
            bool(also_return_unquantized), fmax, fp8_dtype, residual_out)
        return (q, s, y) if also_return_unquantized else (q, s)
    if type(eps) is not float or type(group_size) is not int:
        check_group_type(group_size)
        _check_eps(eps)
    params = ("rmsnorm_group_quant", eps, group_size, scale_layout, bool(ue8m0), fp8_max)
    if not also_return_unquantized:
        qs = _fast.call("norm_quant", params, x, weight, residual, residual_out)
        if qs is not None:
            return qs
    plan = _planned(("rmsnorm_group_quant", eps, group_size, scale_layout, fp8_max),
                    (x, weight, residual, residual_out), check)
    eps, fp8_dtype, fmax = plan.value
    _check_row_count("x", x)
    _check_residual_rows(x, residual, residual_out)
    y = x.new_empty(x.shape) if also_return_unquantized else None
    q, s = _rgq_launch(x, weight, residual, eps, group_size, scale_layout, bool(ue8m0), y, fmax,
                       fp8_dtype, plan.kernels, params if plan.kernels is not None else None,
                       residual_out)
    return (q, s, y) if also_return_unquantized else (q, s)


# ---- dual_rmsnorm_group_quant ----

LIB.define("dual_rmsnorm_group_quant(Tensor q, Tensor q_weight, Tensor kv, Tensor kv_weight, "
           "float eps, int group_size, str scale_layout, bool ue8m0, float fp8_max, "
           "ScalarType fp8_dtype) -> (Tensor, Tensor, Tensor)")


@torch.library.register_fake("codegen::dual_rmsnorm_group_quant")
def _dual_fake(q, q_weight, kv, kv_weight, eps, group_size, scale_layout, ue8m0, fp8_max,
               fp8_dtype):
    t, h = q.shape
    return (q.new_empty((t, h), dtype=fp8_dtype),
            empty_scales(t, h // group_size, scale_layout, q), kv.new_empty(kv.shape))


def _dual_launch(q, q_weight, kv, kv_weight, eps, group_size, scale_layout, ue8m0, fp8_max,
                 fp8_dtype, kernels=None, record=None):
    t, hq = q.shape
    hkv = kv.shape[1]
    q_fp8, q_scales = _quant_outputs(q, group_size, scale_layout, fp8_dtype)
    kv_out = kv.new_empty((t, hkv))
    if t == 0:
        return q_fp8, q_scales, kv_out
    keep = (q, q_weight, kv, kv_weight) if record is not None and all(
        map(_rows_aligned, (q, q_weight, kv, kv_weight))) else None
    q, q_weight, kv, kv_weight = map(_aligned_copy, (q, q_weight, kv, kv_weight))
    hit = kernels.get(bool(ue8m0)) if kernels is not None else None
    fn, uri = hit or _kernel(kernels, bool(ue8m0), "dual_rmsnorm_group_quant", q,
                      dtype=DTYPE_NAMES[q.dtype], group_size=group_size, ue8m0=bool(ue8m0),
                      fp8_max=fp8_max)
    rc = launch(fn, q, q.data_ptr(), q_weight.data_ptr(), q_fp8.data_ptr(), q_scales.data_ptr(),
                kv.data_ptr(), kv_weight.data_ptr(), kv_out.data_ptr(), t, hq, hkv,
                _row_stride_bytes(q), _row_stride_bytes(kv), q_scales.stride(0),
                q_scales.stride(1), eps)
    check_rc(rc, uri)
    if keep is not None:
        _fast.keep(_fast.DUAL, record, keep, (fn, uri), fp8_dtype,
                (hq // group_size, _fast.LAYOUTS[scale_layout], 0), eps)
    return q_fp8, q_scales, kv_out


def _dual_impl(q, q_weight, kv, kv_weight, eps, group_size, scale_layout, ue8m0, fp8_max,
               fp8_dtype):
    plan = _planned(("dual", eps, group_size, scale_layout, fp8_max, fp8_dtype),
                    (q, q_weight, kv, kv_weight),
                    lambda: _check_dual(q, q_weight, kv, kv_weight, eps, group_size,
                                        scale_layout, fp8_max, fp8_dtype))
    eps, fp8_dtype, fp8_max = plan.value
    _check_row_count("q", q)
    _check_dual_rows(q, kv)
    return _dual_launch(q, q_weight, kv, kv_weight, eps, group_size, scale_layout, bool(ue8m0),
                        fp8_max, fp8_dtype, plan.kernels)


LIB.impl("dual_rmsnorm_group_quant", _dual_impl, "CUDA")


def dual_rmsnorm_group_quant(q: torch.Tensor, q_weight: torch.Tensor, kv: torch.Tensor,
                             kv_weight: torch.Tensor, eps: float = 1e-6, group_size: int = 128,
                             *, scale_layout: str = "row", ue8m0: bool = False,
                             fp8_max: float | None = None):
    """DeepSeek MLA's latent norms in one launch: q normalized then group-quantized (as
    rmsnorm_group_quant), kv normalized (as rmsnorm).

    q: [T, Hq] (e.g. 1536; Hq % group_size == 0), kv: [T, Hkv] (e.g. 512; Hkv % 8 == 0), one
    dtype (bf16/fp16), last dims contiguous, rows may be strided; Hq, Hkv <= 8192.
    Returns (q_fp8 [T, Hq], q_scales fp32 [T, Hq/G] in scale_layout, kv_normed [T, Hkv]).
    """
    if type(ue8m0) is not bool:
        check_flag("ue8m0", ue8m0)

    def check():
        return _check_dual(q, q_weight, kv, kv_weight, eps, group_size, scale_layout, fp8_max)
    if torch.compiler.is_compiling():
        eps, fp8_dtype, fmax = check()
        return torch.ops.codegen.dual_rmsnorm_group_quant(
            q, q_weight, kv, kv_weight, eps, group_size, scale_layout, bool(ue8m0), fmax,
            fp8_dtype)
    if type(eps) is not float or type(group_size) is not int:
        check_group_type(group_size)
        _check_eps(eps)
    params = ("dual", eps, group_size, scale_layout, bool(ue8m0), fp8_max)
    out = _fast.call("dual", params, q, q_weight, kv, kv_weight)
    if out is not None:
        return out
    plan = _planned(("dual", eps, group_size, scale_layout, fp8_max),
                    (q, q_weight, kv, kv_weight), check)
    eps, fp8_dtype, fmax = plan.value
    _check_row_count("q", q)
    _check_dual_rows(q, kv)
    return _dual_launch(q, q_weight, kv, kv_weight, eps, group_size, scale_layout, bool(ue8m0),
                        fmax, fp8_dtype, plan.kernels,
                        params if plan.kernels is not None else None)

