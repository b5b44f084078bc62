"""gemm_a8w8_blockscale: FP8 GEMM with 1x128 activation scales and 128x128 weight scales."""
from __future__ import annotations

import torch

from ..dispatch import Unsupported
from ..families import gemm as fam
from ..targets import get_target
from . import _fast
from ._common import (CACHES, LIB, arch, check_rc, check_tensor, is_compiling as _is_compiling,
                      launch, launcher, multiprocessors, on_emulator)

LIB.define("gemm_a8w8_blockscale(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales) -> Tensor")


@torch.library.register_fake("codegen::gemm_a8w8_blockscale")
def _fake(a, a_scales, b, b_scales):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16)


_picks: dict[tuple, tuple] = {}
CACHES.append(_picks)


def fp8_dtype_of(arch_name: str) -> torch.dtype:
    """The fp8 dtype the GEMM takes on an arch (its first FP8 format)."""
    return getattr(torch, get_target(arch_name).fp8_format().torch_dtype)


_FP8_NAMES = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e4m3fnuz: "e4m3fnuz"}


def _launcher(a: torch.Tensor, config: dict):
    """(launcher, uri) of one config for a's device and fp8 format."""
    target = get_target(arch(a))
    return launcher(fam.FAMILY, a, **config, fp8=fam.fp8_token(target, _FP8_NAMES[a.dtype]))


def _kernel(a: torch.Tensor, m: int, n: int, k: int):
    """The dispatched config's launcher, cached per (device, M, N, K): not per M bucket, since
    off the table CDNA's pick reads M itself (whether its tiles fill the device)."""
    key = (a.device, m, n, k)
    hit = _picks.get(key)
    if hit is None:
        hit = _picks[key] = _launcher(a, fam.pick(arch(a), m, n, k, multiprocessors(a)))
    return hit


def _impl(a, a_scales, b, b_scales, config: dict | None = None):
    tensors = (a, a_scales, b, b_scales)
    key = tuple((t.dtype, t.device, t.shape, t.stride()) for t in tensors) if all(
        isinstance(t, torch.Tensor) for t in tensors) else None
    if key not in _checked or a.data_ptr() % 16 or b.data_ptr() % 16:
        _check(a, a_scales, b, b_scales)
        _checked.add(key)
    m, k = a.shape
    n = b.shape[0]
    out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:             # an empty sum
        return out.zero_()
    padded = k % 16 != 0
    if padded:
        a, b, k = _zero_padded(a), _zero_padded(b), fam.padded_k(k)
    fn, uri = _kernel(a, m, n, k) if config is None else _launcher(a, config)
    args = (m, n, k, a.stride(0), b.stride(0), a_scales.stride(0), a_scales.stride(1),
            b_scales.stride(0), b_scales.stride(1))
    if config is None and not padded and not torch.compiler.is_compiling():
        _plans[_plan_key(a, a_scales, b, b_scales)] = (fn, uri, m, n, k, args)
        _fast.keep(_fast.GEMM, (), tensors, (fn, uri), torch.bfloat16, args)
    rc = launch(fn, a, a.data_ptr(), b.data_ptr(), a_scales.data_ptr(), b_scales.data_ptr(),
                out.data_ptr(), *args)
    check_rc(rc, uri)
    return out


LIB.impl("gemm_a8w8_blockscale", _impl, "CUDA")


def _zero_padded(t: torch.Tensor) -> torch.Tensor:
    """t's rows copied into rows of fam.padded_k(K) bytes, zero past K."""
    pad = fam.padded_k(t.shape[1]) - t.shape[1]
    return torch.nn.functional.pad(t.view(torch.uint8), (0, pad)).view(t.dtype)


def _check(a, a_scales, b, b_scales) -> None:
    try:
        target = get_target(arch(a)) if isinstance(a, torch.Tensor) and (
            a.is_cuda or on_emulator(a)) else None
    except ValueError as e:
        raise Unsupported(f"a: device arch not supported: {e}") from None
    fp8 = {getattr(torch, f.torch_dtype) for f in target.fp8_formats} if target else {
        torch.float8_e4m3fn, torch.float8_e4m3fnuz}
    if target is not None and not fp8:
        raise Unsupported(f"a: arch {target.arch} has no FP8 matrix instructions")
    check_tensor("a", a, dtypes=tuple(fp8), ndim=2)
    check_tensor("b", b, dtypes=(a.dtype,), ndim=2)
    check_tensor("a_scales", a_scales, dtypes=(torch.float32,), ndim=2, any_strides=True)
    check_tensor("b_scales", b_scales, dtypes=(torch.float32,), ndim=2, any_strides=True)
    for name, t in (("b", b), ("a_scales", a_scales), ("b_scales", b_scales)):
        if t.device != a.device:
            raise ValueError(f"{name}: on {t.device}, but a is on {a.device}")
    (m, k), (n, kb_) = a.shape, b.shape
    if kb_ != k:
        raise ValueError(f"b: shape {tuple(b.shape)} has K={kb_}, a has K={k}")
    for name, t in (("a", a), ("b", b)):
        if k % 16:      # copied into aligned rows (_zero_padded)
            continue
        if t.stride(0) % 16 or t.data_ptr() % 16:
            raise ValueError(f"{name}: rows must start on 16-byte boundaries "
                             f"(row stride {t.stride(0)}, address {t.data_ptr():#x})")
        if t.shape[0] > 1 and t.stride(0) < k:    # a TMA box cannot describe such rows
            raise ValueError(f"{name}: row stride {t.stride(0)} is smaller than K={k} (rows "
                             f"overlap, as after expand()); pass {name}.contiguous()")
    kb = -(-k // fam.SCALE_BLOCK)
    if tuple(a_scales.shape) != (m, kb):
        raise ValueError(f"a_scales: shape {tuple(a_scales.shape)}, expected ({m}, {kb}) "
                         f"(one scale per row and 128 columns of K)")
    if tuple(b_scales.shape) != (-(-n // fam.SCALE_BLOCK), kb):
        raise ValueError(f"b_scales: shape {tuple(b_scales.shape)}, expected "
                         f"({-(-n // fam.SCALE_BLOCK)}, {kb}) (one scale per 128x128 block)")
    if max(m, n, k) >= 2**31:
        raise ValueError(f"a, b: dimensions ({m}, {n}, {k}) must be below 2^31")


_checked: set = set()
CACHES.append(_checked)


def gemm_a8w8_blockscale(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor,
                         b_scales: torch.Tensor) -> torch.Tensor:
    """out [M, N] bf16 = sum over 128-wide K blocks of (A @ B^T) * a_scales * b_scales.

    a [M, K] and b [N, K]: the device's FP8 format (e4m3fn; e4m3fnuz on gfx942), last dim
    contiguous; rows 16-byte aligned where K % 16 == 0, else both are copied per call into
    zero-padded rows of the next multiple of 16 (K past the last full block counts as zeros).
    a_scales [M, ceil(K/128)] fp32 in any strides: row-major, or the column-major "col" /
    "col_tma" layouts per_token_group_quant_fp8 and rmsnorm_group_quant produce.
    b_scales [ceil(N/128), ceil(K/128)] fp32 in any strides.
    """
    if _is_compiling():   # checked again by _impl when the graph runs
        return torch.ops.codegen.gemm_a8w8_blockscale(a, a_scales, b, b_scales)
    out = _fast.call("gemm", (), a, a_scales, b, b_scales)   # where the signature has a plan
    if out is not None:
        return out
    # Everything but the data pointers is checked once per plan key (shapes, strides, dtypes,
    # devices); the eager path then checks alignment, allocates and launches.
    try:
        plan = _plans.get(_plan_key(a, a_scales, b, b_scales))
    except (AttributeError, TypeError):     # not tensors: _impl's checks name the argument
        plan = None
    if plan is None:
        return _impl(a, a_scales, b, b_scales)
    pa, pb = a.data_ptr(), b.data_ptr()
    if pa % 16 or pb % 16:
        return _impl(a, a_scales, b, b_scales)
    fn, uri, m, n, k, args = plan
    out = a.new_empty((m, n), dtype=torch.bfloat16)
    if m and n:
        rc = launch(fn, a, pa, pb, a_scales.data_ptr(), b_scales.data_ptr(), out.data_ptr(),
                    *args)
        if rc:
            check_rc(rc, uri)
    return out


_plans: dict[tuple, tuple] = {}
CACHES.append(_plans)


def _plan_key(a, a_scales, b, b_scales) -> tuple:
    """What _check reads: shapes, strides, dtypes and devices (its [12] is a's device)."""
    return (a.shape, a.stride(), b.shape, b.stride(), a_scales.shape, a_scales.stride(),
            b_scales.shape, b_scales.stride(), a.dtype, b.dtype, a_scales.dtype, b_scales.dtype,
            a.get_device(), b.get_device(), a_scales.get_device(), b_scales.get_device())


def gemm_with_config(a, a_scales, b, b_scales, config: dict) -> torch.Tensor:
    """The GEMM with one explicit tile config (codegen.families.gemm.config): tests, tuner."""
    return _impl(a, a_scales, b, b_scales, config)
