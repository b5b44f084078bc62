"""Torch references: the numeric contracts of docs/numerics.md, stated in plain PyTorch (fp32 math).

Every generated kernel is tested against these.
"""
from __future__ import annotations

import torch

EPS_AMAX = 1e-10


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(s)) computed exactly (log2 in fp32 rounds near powers of two)."""
    mant, exp = torch.frexp(s)            # s = mant * 2^exp, mant in [0.5, 1)
    exp = torch.where(mant == 0.5, exp - 1, exp)
    out = torch.ldexp(torch.ones_like(s), exp)
    return torch.where(torch.isfinite(s), out, s)


def group_quant_fp8(x: torch.Tensor, group_size: int, fp8_dtype: torch.dtype, fp8_max: float,
                    ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group quant: q [T, H] fp8 and row-major fp32 scales [T, H/G].

    NaN in a group makes its scale NaN and its bytes fp8 NaN; +-inf makes the scale inf, the inf
    elements NaN (inf/inf) and the others 0.
    """
    t, h = x.shape
    xg = x.float().reshape(t, h // group_size, group_size)
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp_min(EPS_AMAX)
    amax = torch.where(torch.isnan(xg).any(-1, keepdim=True), float("nan"), amax)
    # divide by a tensor: torch turns division by a Python scalar into a reciprocal multiply
    scale = amax / torch.full_like(amax, fp8_max)
    if ue8m0:
        scale = pow2_ceil(scale)
    q = (xg / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return q.reshape(t, h), scale.reshape(t, h // group_size)


# ---- RMSNorm family (docs/numerics.md, "RMSNorm family") ----
# Divisions below are by full tensors: torch divides a CUDA tensor by a Python scalar as a
# multiplication by its reciprocal, which is not the IEEE quotient.

def rms_scale(xf: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(x^2) + eps) per row of fp32 x, as [T, 1]: sum / H and 1 / sqrt with IEEE
    division, sqrt correctly rounded (what the kernels do; torch.rsqrt would be within ulps)."""
    ss = (xf * xf).sum(dim=-1, keepdim=True)
    ms = ss / torch.full_like(ss, xf.shape[-1])
    d = torch.sqrt(ms + eps)
    return torch.ones_like(d) / d


def rmsnorm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The normalized values before rounding: x_f32 * rms_scale * w_f32 (in that order)."""
    xf = x.float()
    return (xf * rms_scale(xf, eps)) * weight.float()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = dtype(x_f32 * rsqrt(mean(x_f32^2) + eps) * w_f32), one rounding at the end."""
    return rmsnorm_fp32(x, weight, eps).to(x.dtype)


def residual_add(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """r = dtype(x + residual): the fp32 sum rounded once (what torch's x + residual does)."""
    return (x.float() + residual.float()).to(x.dtype)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, r): r = dtype(x + residual) (the op writes it into residual), y = rmsnorm(r)."""
    r = residual_add(x, residual)
    return rmsnorm(r, weight, eps), r


def rmsnorm_group_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
                        fp8_dtype: torch.dtype, fp8_max: float, ue8m0: bool = False,
                        residual: torch.Tensor | None = None):
    """(q, scales, y, r): the fp32 normalized values group-quantized (row-major scales), y
    their dtype rounding, r the updated residual (None without one)."""
    r = None
    if residual is not None:
        x = r = residual_add(x, residual)
    yf = rmsnorm_fp32(x, weight, eps)
    q, s = group_quant_fp8(yf, group_size, fp8_dtype, fp8_max, ue8m0)
    return q, s, yf.to(x.dtype), r


def dual_rmsnorm_group_quant(q: torch.Tensor, q_weight: torch.Tensor, kv: torch.Tensor,
                             kv_weight: torch.Tensor, eps: float, group_size: int,
                             fp8_dtype: torch.dtype, fp8_max: float, ue8m0: bool = False):
    """(q_fp8, q_scales, kv_normed): rmsnorm_group_quant of q, rmsnorm of kv."""
    qq, qs, _, _ = rmsnorm_group_quant(q, q_weight, eps, group_size, fp8_dtype, fp8_max, ue8m0)
    return qq, qs, rmsnorm(kv, kv_weight, eps)


# ---- FP8 block-scale GEMM (docs/numerics.md, "FP8 block-scale GEMM") ----

def gemm_a8w8_blockscale(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor,
                         b_scales: torch.Tensor, block: int = 128) -> torch.Tensor:
    """out [M, N] bf16 = sum over K blocks of (A_kb @ B_kb^T) * As[:, kb] * Bs[n / block, kb].

    Dequantizes in fp32 (exact: fp8 * fp32 scale) and multiplies in fp64, so the reference
    itself carries no fp32 accumulation error. K need not be a multiple of the block.
    """
    m, k = a.shape
    n = b.shape[0]
    kb = -(-k // block)
    assert a_scales.shape == (m, kb) and b_scales.shape == (-(-n // block), kb)
    col_block = torch.arange(k, device=a.device) // block
    a_deq = a.double() * a_scales.double()[:, col_block]
    row_block = torch.arange(n, device=a.device) // block
    b_deq = b.double() * b_scales.double()[row_block][:, col_block]
    return (a_deq @ b_deq.t()).to(torch.bfloat16)


# The GEMM's contract is the mean; each element is held to more, since a mean over the whole
# output hides a wrong tail block, tail row or small row: a bf16 ulp of the reference (2^-7 of
# it at most) plus GEMM_ROW_TOL of its row's mean |ref| (fp32 sums against fp64 where values
# cancel, and Hopper's FP8 MMAs add at less than fp32's precision inside a K block).
GEMM_MEAN_TOL = 1e-3
GEMM_ROW_TOL = 2.0**-7


def gemm_errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, tuple[int, int]]:
    """(mean |out - ref| / mean |ref|, the largest error past a bf16 ulp of ref in its row's
    mean |ref|, where that one is); NaN where out has NaN."""
    o, r = out.float(), ref.float()
    err = (o - r).abs()
    mean = (err.mean() / r.abs().mean()).item() if out.numel() else 0.0
    if not out.numel():
        return mean, 0.0, (0, 0)
    row = r.abs().mean(dim=1, keepdim=True)
    excess = (err - 2.0**-7 * r.abs()) / torch.where(row > 0, row, 1.0)
    worst = excess.max().item() if not torch.isnan(excess).any() else float("nan")
    where = divmod(excess.nan_to_num(float("inf")).argmax().item(), out.shape[1])
    return mean, worst, where
