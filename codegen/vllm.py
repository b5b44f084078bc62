"""The ops under the names, argument order and keywords that vLLM's call sites use, so a caller
swaps implementations without touching them:

    from codegen.vllm import (per_token_group_quant_fp8, rms_norm, fused_add_rms_norm,
                              rms_norm_per_block_quant, w8a8_triton_block_scaled_mm)

Each follows its vLLM namesake's layouts and in-place conventions; where an argument asks for
something the kernels do not do, the call fails naming the argument, never silently ignores it.
Numerics are this project's (docs/numerics.md), and differ from vLLM's kernels where those
round differently (within an ulp of the output, or one FP8 step):
- rms_norm, fused_add_rms_norm: vLLM rounds x * rsqrt(...) to the input dtype before it
  multiplies by the weight; here the fp32 product is rounded once;
- rms_norm_per_block_quant: the fp32 normalized values are quantized (vLLM rounds them first);
  with residual, the rounded sum is normalized (vLLM: the fp32 sum); vLLM floors every scale at
  1 / (fp8_max * 512), here only amax is floored, at 1e-10;
- w8a8_triton_block_scaled_mm: computed as bf16, then cast to output_dtype (vLLM casts the
  fp32 sums), so its fp16 default carries bf16's precision.
"""
from __future__ import annotations

import functools

import torch

from . import ops
from .ops import quant
from .ops._common import check_tensor, on_emulator
from .reference import EPS_AMAX

__all__ = ["per_token_group_quant_fp8", "rms_norm", "fused_add_rms_norm",
           "rms_norm_per_block_quant", "w8a8_triton_block_scaled_mm", "w8a8_block_fp8_matmul"]


def renamed(e: Exception, names: dict) -> Exception:
    """e, or where its message starts with one of the ops' argument names (a key of names), the
    same error naming this entry point's argument instead."""
    head, sep, rest = str(e).partition(":")
    if sep and head in names and type(e) in (TypeError, ValueError):
        return type(e)(names[head] + sep + rest)
    return e


def named(**names):
    """Decorator: the ops' errors name this entry point's arguments (op's name=its name)."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (TypeError, ValueError) as e:
                raise renamed(e, names) from None
        return call
    return wrap


def _same_shape(name: str, t, x: torch.Tensor, x_name: str) -> None:
    """t (a tensor beside x, paired with it row by row once both are flattened) has x's shape."""
    if isinstance(t, torch.Tensor) and isinstance(x, torch.Tensor) and t.shape != x.shape:
        raise ValueError(f"{name}: shape {tuple(t.shape)} must match {x_name} {tuple(x.shape)}")


@named(out="out_q", fp8_dtype="dtype")
def per_token_group_quant_fp8(x: torch.Tensor, group_size: int, eps: float = EPS_AMAX,
                              dtype: torch.dtype | None = None,
                              column_major_scales: bool = False,
                              tma_aligned_scales: bool = False,
                              out_q: torch.Tensor | None = None,
                              use_ue8m0: bool | None = None
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's fp8_utils.per_token_group_quant_fp8: x [..., K] -> (x_q [..., K] fp8,
    x_s fp32 [..., K/group_size]); column_major_scales: x_s strides (1, M) for 2-D x, and
    (1, round_up(M, 4)) with tma_aligned_scales (which row-major scales ignore, as vLLM's).
    eps: the amax floor; the kernels' is 1e-10. use_ue8m0=None means False here (vLLM derives
    it from its DeepGEMM settings)."""
    if eps != EPS_AMAX:
        raise ValueError(f"eps: {eps}; the kernels floor the group amax at {EPS_AMAX} only")
    if column_major_scales and x.dim() != 2:
        raise ValueError(f"x: column-major scales need 2-D x, got shape {tuple(x.shape)}")
    layout = ("col_tma" if tma_aligned_scales else "col") if column_major_scales else "row"
    flat = x.dim() == 2
    if out_q is not None and not (isinstance(out_q, torch.Tensor) and
                                  out_q.shape == x.shape and out_q.is_contiguous()):
        check_tensor("x", x)      # raises naming x, else the next line naming out_q
        quant.check_out(out_q, x, quant.resolve_fp8(x, dtype, None)[0], "out_q")
    q, s = ops.per_token_group_quant_fp8(_rows(x), group_size, scale_layout=layout,
                                         ue8m0=bool(use_ue8m0), fp8_dtype=dtype,
                                         out=None if out_q is None else _rows(out_q, "out_q"))
    if flat:
        return q, s
    return q.view(x.shape) if out_q is None else out_q, s.view(*x.shape[:-1], s.shape[-1])


def _rows(t: torch.Tensor, written: str | None = None) -> torch.Tensor:
    """t as [rows, last dim]: itself where it is 2-D already (a view costs a dispatch). A tensor
    the op writes (written: its argument's name) must be a view of t, not a copy."""
    if not isinstance(t, torch.Tensor) or t.dim() == 2:     # the op names what is wrong
        return t
    if not written:
        return t.reshape(-1, t.shape[-1])
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(f"{written}: strides {t.stride()} do not let its {t.dim()} dims be viewed "
                         f"as rows; the op writes it in place") from None


def _unit_weight(weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return weight if weight is not None else torch.ones(x.shape[-1], dtype=x.dtype,
                                                        device=x.device)


@named(x="input", eps="epsilon")
def rms_norm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None,
             epsilon: float) -> None:
    """vLLM's _custom_ops.rms_norm: out = rmsnorm(input) * weight (weight None: ones)."""
    _same_shape("out", out, input, "input")
    ops.rmsnorm(_rows(input), _unit_weight(weight, input), epsilon, out=_rows(out, "out"))


@named(x="input", out="input", eps="epsilon")
def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor,
                       weight: torch.Tensor | None, epsilon: float) -> None:
    """vLLM's _custom_ops.fused_add_rms_norm, in place: residual = input + residual, then
    input = rmsnorm(residual) * weight. input's rows may lie apart (strided)."""
    _same_shape("residual", residual, input, "input")
    x, r = _rows(input, "input"), _rows(residual, "residual")
    fused_add_in_place(x, r, _unit_weight(weight, input), epsilon)


def fused_add_in_place(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps) -> None:
    """x <- rmsnorm(r <- x + r): written over x where its rows are contiguous, else copied
    back (the ops write contiguous rows)."""
    if not isinstance(x, torch.Tensor) or x.is_contiguous():
        ops.fused_add_rmsnorm(x, r, w, eps, out=x)
    else:
        x.copy_(ops.fused_add_rmsnorm(x, r, w, eps))


@named(x="input", eps="epsilon")
def rms_norm_per_block_quant(input: torch.Tensor, weight: torch.Tensor, epsilon: float,
                             quant_dtype: torch.dtype, group_size: list[int],
                             scale_ub: torch.Tensor | None = None,
                             residual: torch.Tensor | None = None,
                             is_scale_transposed: bool = False, tma_alignment: int = 0
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's _custom_ops.rms_norm_per_block_quant: input [..., H] -> (out [..., H] fp8,
    scales fp32 [T, H/g], T = input's rows) with g = group_size[1] (32, 64 or 128); residual, if
    given, becomes input + residual in place and is normalized instead. is_scale_transposed:
    scales strides (1, T); tma_alignment=4: (1, round_up(T, 4)) for 2-D input (row-major scales
    ignore it, as vLLM's). Numerics: as the module's docstring says."""
    if scale_ub is not None:
        raise ValueError("scale_ub: an upper bound on the scales is not supported")
    if len(group_size) != 2 or group_size[0] != 1:
        raise ValueError(f"group_size: expected [1, g], got {group_size}")
    if tma_alignment not in (0, 4):
        raise ValueError(f"tma_alignment: expected 0 or 4, got {tma_alignment}")
    layout = ("col_tma" if tma_alignment else "col") if is_scale_transposed else "row"
    if layout == "col_tma" and isinstance(input, torch.Tensor) and input.dim() != 2:
        raise ValueError(f"input: TMA-aligned scales need 2-D input, got shape "
                         f"{tuple(input.shape)}")
    _same_shape("residual", residual, input, "input")
    # before the call, which may update residual (elsewhere than a GPU the op refuses x first)
    if isinstance(input, torch.Tensor) and (input.is_cuda or on_emulator(input)):
        fp8 = quant.resolve_fp8(input, None, None)[0]
        if fp8 != quant_dtype:
            raise ValueError(f"quant_dtype: {quant_dtype} is not this device's FP8 format "
                             f"({fp8})")
    q, s = ops.rmsnorm_group_quant(_rows(input), weight, epsilon, group_size[1],
                                   residual=_rows(residual, "residual"), scale_layout=layout)
    return (q, s) if q.shape == input.shape else (q.view(input.shape), s)


@named(a="A", b="B", a_scales="As", b_scales="Bs")
def w8a8_triton_block_scaled_mm(A: torch.Tensor, B: torch.Tensor, As: torch.Tensor,
                                Bs: torch.Tensor, block_size: list[int],
                                output_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """vLLM's fp8_utils.w8a8_triton_block_scaled_mm: C [..., N] = A [..., K] @ B [N, K]^T with
    As [..., ceil(K/128)] per token and 128 columns, Bs [ceil(N/128), ceil(K/128)] per
    128 x 128 block; block_size must be [128, 128]. Computed as bf16, then output_dtype."""
    if list(block_size) != [128, 128]:
        raise ValueError(f"block_size: {list(block_size)}; the kernels take [128, 128] blocks")
    if output_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"output_dtype: {output_dtype}; expected torch.bfloat16, torch.float16 "
                         f"or torch.float32")
    c = ops.gemm_a8w8_blockscale(_rows(A), _rows(As), B, Bs)
    if c.dtype != output_dtype:
        c = c.to(output_dtype)
    return c if A.dim() == 2 else c.view(*A.shape[:-1], B.shape[0])


w8a8_block_fp8_matmul = w8a8_triton_block_scaled_mm    # its earlier name in vLLM
