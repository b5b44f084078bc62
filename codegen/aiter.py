"""The ops under the names, argument order, keywords and defaults of AMD AITER's Python entry
points that vLLM's ROCm path calls, so an engine written against AITER swaps implementations
without touching its call sites:

    from codegen.aiter import (rms_norm, rmsnorm2d_fwd, rms_norm_cu, rmsnorm2d_fwd_with_add,
                               fused_add_rms_norm_cu, per_group_quant_hip, get_hip_quant,
                               gemm_a8w8_blockscale, fused_rms_fp8_group_quant)

Each keeps its AITER namesake's return values, in-place conventions and scale layouts. AITER's
FP8 max is torch.finfo(dtype).max, so these quantize with 240 on gfx942 (e4m3fnuz), where the
ops default to 224, and 448 elsewhere. An argument asking for something the kernels do not do
fails naming the argument. Numerics are this project's (docs/numerics.md), and differ from
AITER's kernels where those round differently:
- scales are amax / max and quantized values x / scale, each an IEEE division; AITER's HIP quant
  multiplies amax by a rounded 1 / max (scales differ in the last bit in about half the groups,
  and a byte may follow) and x by 1 / scale (one FP8 step on rare elements);
- the fused residual adds (rmsnorm2d_fwd_with_add, fused_rms_fp8_group_quant with res1)
  normalize the sum rounded to the dtype, as it is stored; AITER's normalize the fp32 sum
  (outputs within about an ulp).
"""
from __future__ import annotations

import enum
import functools

import torch

from . import ops
from .ops._common import CACHES, check_tensor
from .ops.quant import resolve_fp8
from .vllm import _rows, _same_shape, fused_add_in_place, named, renamed

__all__ = ["rms_norm", "rmsnorm2d_fwd", "rms_norm_cu", "rmsnorm2d_fwd_with_add",
           "fused_add_rms_norm_cu",
           "per_group_quant_hip", "get_hip_quant", "QuantType", "gemm_a8w8_blockscale",
           "fused_rms_fp8_group_quant"]

_FP8_MAX = {d: torch.finfo(d).max for d in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)}


def _plain_norm(use_model_sensitive_rmsnorm, gemma_norm=False) -> None:
    if use_model_sensitive_rmsnorm:
        raise ValueError(f"use_model_sensitive_rmsnorm: {use_model_sensitive_rmsnorm}; only 0 "
                         f"(x * rsqrt(mean(x^2) + eps) * weight in fp32) is supported")
    if gemma_norm:
        raise ValueError("gemma_norm: the (1 + weight) form is not supported")


_fp8_max_seen: dict[tuple, float] = {}     # (CUDA / HIP device index, dtype) -> max
CACHES.append(_fp8_max_seen)


def _fp8_max(x: torch.Tensor, x_name: str, dtype, name: str) -> float:
    """AITER's FP8 max for dtype, torch.finfo(dtype).max, once dtype is known to be the FP8
    format of x's device (None: that format)."""
    key = (x.get_device(), dtype) if isinstance(x, torch.Tensor) and x.is_cuda else None
    hit = _fp8_max_seen.get(key)
    if hit is not None:
        return hit
    if dtype is not None and dtype not in _FP8_MAX:
        raise ValueError(f"{name}: {dtype}; the kernels write FP8 (torch.float8_e4m3fn, or "
                         f"torch.float8_e4m3fnuz on gfx942)")
    check_tensor(x_name, x)
    device_dtype = resolve_fp8(x, None, None)[0]
    if dtype is not None and dtype != device_dtype:
        raise ValueError(f"{name}: {dtype} is not this device's FP8 format ({device_dtype})")
    if key is not None:
        _fp8_max_seen[key] = _FP8_MAX[device_dtype]
    return _FP8_MAX[device_dtype]


def aiter_scales(s: torch.Tensor, transpose_scale: bool, strided: bool = False) -> torch.Tensor:
    """Scales as AITER returns them, from the ops' "row" or "col" layouts. transpose_scale: the
    column-major buffer seen through a contiguous [T, G] view (element (t, g) lies at g * T + t,
    not at [t, g]), as AITER's GEMMs with column-major x_scale read it; with strided, the
    column-major tensor itself (strides (1, T))."""
    if not transpose_scale or strided:
        return s
    return s.as_strided(s.shape, (s.shape[1], 1))     # the same storage, [G, T] read as [T, G]


@named(x="input", eps="epsilon")
def rms_norm(input: torch.Tensor, weight: torch.Tensor, epsilon: float,
             use_model_sensitive_rmsnorm: int = 0) -> torch.Tensor:
    """aiter.rms_norm: a new tensor, input's shape and dtype, rmsnorm(input) * weight."""
    _plain_norm(use_model_sensitive_rmsnorm)
    y = ops.rmsnorm(_rows(input), weight, epsilon)
    return y if input.dim() == 2 else y.view(input.shape)


rmsnorm2d_fwd = rms_norm     # the same entry point under its older name


@named(x="input", eps="epsilon")
def rms_norm_cu(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                epsilon: float) -> None:
    """aiter.rms_norm_cu: out = rmsnorm(input) * weight, into the caller's out."""
    _same_shape("out", out, input, "input")
    ops.rmsnorm(_rows(input), weight, epsilon, out=_rows(out, "out"))


@named(x="input", residual="residual_in", eps="epsilon")
def rmsnorm2d_fwd_with_add(out: torch.Tensor, input: torch.Tensor, residual_in: torch.Tensor,
                           residual_out: torch.Tensor, weight: torch.Tensor, epsilon: float,
                           gemma_norm: bool = False, use_model_sensitive_rmsnorm: int = 0) -> None:
    """aiter.rmsnorm2d_fwd_with_add: residual_out = input + residual_in, out =
    rmsnorm(residual_out) * weight; input and residual_in are only read (one kernel, one pass
    over each operand)."""
    _plain_norm(use_model_sensitive_rmsnorm, gemma_norm)
    for name, t in (("out", out), ("residual_in", residual_in), ("residual_out", residual_out)):
        _same_shape(name, t, input, "input")
    ops.fused_add_rmsnorm(_rows(input), _rows(residual_in), weight, epsilon,
                          out=_rows(out, "out"),
                          residual_out=_rows(residual_out, "residual_out"))


@named(x="input", residual="residual_in", out="input", eps="epsilon")
def fused_add_rms_norm_cu(input: torch.Tensor, residual_in: torch.Tensor, weight: torch.Tensor,
                          epsilon: float) -> None:
    """aiter.fused_add_rms_norm_cu, in place: residual_in = input + residual_in, then input =
    rmsnorm(residual_in) * weight. input's rows may lie apart (strided)."""
    _same_shape("residual_in", residual_in, input, "input")
    fused_add_in_place(_rows(input, "input"), _rows(residual_in, "residual_in"), weight, epsilon)


def per_group_quant_hip(x: torch.Tensor, scale: torch.Tensor | None = None,
                        quant_dtype: torch.dtype = torch.int8, group_size: int = 128,
                        transpose_scale: bool = False, num_rows: torch.Tensor | None = None,
                        num_rows_factor: int = 1, scale_type: torch.dtype = torch.float32
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """aiter's per-group quant (get_hip_quant(QuantType.per_1x128)): x [..., K] -> (y [..., K]
    quant_dtype, scale fp32 [..., K / group_size]); transpose_scale: the scales column-major
    behind the same shape (aiter_scales). quant_dtype must be the device's FP8 format (AITER's
    default, int8, is not built here); dynamic scales only, as AITER's."""
    if scale is not None:
        raise ValueError("scale: static scales are not supported (dynamic quant only)")
    if num_rows is not None or num_rows_factor != 1:
        raise ValueError("num_rows: a device-side row count is not supported; pass x's valid rows")
    if scale_type != torch.float32:
        raise ValueError(f"scale_type: {scale_type}; the scales are torch.float32")
    fp8_max = _fp8_max(x, "x", quant_dtype, "quant_dtype")
    y, s = ops.per_token_group_quant_fp8(_rows(x), group_size, fp8_dtype=quant_dtype,
                                         fp8_max=fp8_max,
                                         scale_layout="col" if transpose_scale else "row")
    s = aiter_scales(s, transpose_scale)
    if x.dim() == 2:
        return y, s
    return y.view(x.shape), s.view(*x.shape[:-1], s.shape[-1])


class QuantType(enum.IntEnum):
    """aiter.QuantType, as its members are numbered (only per_1x128 is built)."""
    No = 0
    per_Tensor = 1
    per_Token = 2
    per_1x32 = 3
    per_1x128 = 4
    per_128x128 = 5
    per_256x128 = 6
    per_1024x128 = 7


class NotBuilt(NotImplementedError, ValueError):
    """A quant type with no kernel here: AITER's NotImplementedError, and a ValueError as every
    other refused argument."""


def get_hip_quant(quant_type):
    """aiter.get_hip_quant: the quant function for a QuantType (this module's, aiter's, or the
    member's name). QuantType.No passes x through as (x, None), as AITER's does; per_1x128 is
    the one built. As AITER does for the types it lacks, the others give a function that raises
    NotImplementedError when called, not at the lookup (engines look types up at start-up
    whether or not they run them)."""
    name = getattr(quant_type, "name", quant_type)
    if name == "per_1x128":
        return functools.partial(per_group_quant_hip, group_size=128)
    if name == "No":
        return lambda x, *args, **kwargs: (x, None)

    def not_built(*args, **kwargs):
        raise NotBuilt(f"quant_type: {name}; only per_1x128 (1 x 128 groups) is built")
    return not_built


@named(a="XQ", b="WQ", a_scales="x_scale", b_scales="w_scale")
def gemm_a8w8_blockscale(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor,
                         w_scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                         isBpreshuffled: bool = False) -> torch.Tensor:
    """aiter.gemm_a8w8_blockscale: Y [M, N] dtype (bf16 or fp16) = XQ [M, K] @ WQ [N, K]^T
    with x_scale [M, K/128] per token and 128 columns, w_scale [N/128, K/128] per 128 x 128
    block. x_scale is read through its strides (AITER's CK kernel takes row-major only), so
    per_group_quant_hip's transpose_scale=True form, column-major data behind row-major
    strides, is misread here as it is there: pass row-major scales or a strided view. Computed
    in bf16, then converted to fp16 if asked."""
    if isBpreshuffled:
        raise ValueError("isBpreshuffled: pre-shuffled weights are not supported; pass WQ [N, K]")
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"dtype: {dtype}; expected torch.bfloat16 or torch.float16")
    y = ops.gemm_a8w8_blockscale(XQ, x_scale, WQ, w_scale)
    return y if dtype == torch.bfloat16 else y.to(dtype)


# the ops' argument names as fused_rms_fp8_group_quant calls them
_INP1_NAMES = {"x": "inp1", "weight": "inp1_weight", "residual": "res1", "q": "inp1",
               "q_weight": "inp1_weight", "kv": "inp2", "kv_weight": "inp2_weight",
               "eps": "inp1_epsilon"}
_INP2_NAMES = {"x": "inp2", "weight": "inp2_weight", "eps": "inp2_epsilon"}


def fused_rms_fp8_group_quant(inp1: torch.Tensor, inp1_weight: torch.Tensor, inp1_epsilon: float,
                              inp2: torch.Tensor | None = None,
                              inp2_weight: torch.Tensor | None = None,
                              inp2_epsilon: float | None = None, group_size: int = 128,
                              dtype_quant: torch.dtype | None = None,
                              res1: torch.Tensor | None = None,
                              output_unquantized_inp1: bool = False,
                              transpose_scale: bool = False, is_x_scale_strided: bool = False):
    """aiter.ops.triton.quant.fused_fp8_quant.fused_rms_fp8_group_quant. Returns
    ((out1_fp8, out1_bs), out1, out2, out_res1):
    - out1_fp8 [M, N1] and out1_bs fp32 [M, N1 / group_size]: rmsnorm(inp1 (+ res1)) * weight in
      fp32, group-quantized (group_size 32, 64 or 128); transpose_scale / is_x_scale_strided as
      aiter_scales;
    - out1: the same normalized values in inp1's dtype if output_unquantized_inp1, else None;
    - out2: rmsnorm(inp2) * inp2_weight in inp1's dtype (not quantized, no residual) if inp2 is
      given, else None;
    - out_res1: inp1 + res1 if res1 is given, else None.
    Every output is new; no input is written. With inp2 and nothing that the one-launch MLA kernel
    lacks (a residual, the unquantized copy, a second epsilon, rows over 8192), one launch."""
    if inp2 is not None and (inp2_weight is None or inp2_epsilon is None):
        raise ValueError("inp2_weight, inp2_epsilon: required with inp2")
    fp8_max = _fp8_max(inp1, "inp1", dtype_quant, "dtype_quant")
    layout = "col" if transpose_scale else "row"
    out_res1 = torch.empty_like(res1, memory_format=torch.contiguous_format) \
        if res1 is not None else None
    dual = (inp2 is not None and res1 is None and not output_unquantized_inp1
            and inp2_epsilon == inp1_epsilon and inp2.dtype == inp1.dtype
            and inp1.shape[-1] <= 8192 and inp2.shape[-1] <= 8192 and inp2.shape[-1] % 8 == 0)
    try:
        if dual:
            q, s, out2 = ops.dual_rmsnorm_group_quant(inp1, inp1_weight, inp2, inp2_weight,
                                                      inp1_epsilon, group_size,
                                                      scale_layout=layout, fp8_max=fp8_max)
            out1 = None
        else:
            r = ops.rmsnorm_group_quant(inp1, inp1_weight, inp1_epsilon, group_size,
                                        residual=res1, residual_out=out_res1,
                                        scale_layout=layout, fp8_max=fp8_max,
                                        also_return_unquantized=output_unquantized_inp1)
            q, s, out1 = r if output_unquantized_inp1 else (*r, None)
    except (TypeError, ValueError) as e:
        raise renamed(e, _INP1_NAMES) from None
    if not dual:
        try:
            out2 = ops.rmsnorm(inp2, inp2_weight, inp2_epsilon) if inp2 is not None else None
        except (TypeError, ValueError) as e:
            raise renamed(e, _INP2_NAMES) from None
        if out2 is not None and out2.dtype != inp1.dtype:    # AITER's out2 is in inp1's dtype
            out2 = out2.to(inp1.dtype)
    return (q, aiter_scales(s, transpose_scale, is_x_scale_strided)), out1, out2, out_res1
