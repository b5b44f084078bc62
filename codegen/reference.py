"""Torch references: the numeric contracts of NUMERICS.md, stated in plain PyTorch (fp32 math).

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
