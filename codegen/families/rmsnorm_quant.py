"""RMSNorm + per-token-group FP8 quant: decisions for rmsnorm_group_quant.cu.j2.

Rows follow the RMSNorm tier table (families/rmsnorm.py), so a fused kernel sums exactly like the
rmsnorm kernel; the normalized values (fp32) go to cg::quantize_group, the quant kernel's own
code, with each group of G values in G/8 consecutive lanes (8 values per lane).
"""
from __future__ import annotations

import ctypes
from typing import Callable

from ..spec import Variant
from .quant import cvt_clamps
from .rmsnorm import CHUNK, DTYPES, Tier, tier_context, tiers

# launcher(x, residual, residual_out, weight, q, scales, y, rows, h, x_row_stride_bytes,
#          residual_row_stride_bytes, residual_out_row_stride_bytes, scale_row_stride,
#          scale_col_stride, eps, stream)
# residual and y may be null, residual_out null for in place; scale strides are in elements
# (any layout: row, col, col_tma).
ARGTYPES = [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 7 + [ctypes.c_float, ctypes.c_void_p]


def tpg(group_size: int) -> int:
    return group_size // CHUNK


def validate(v: Variant) -> str | None:
    g = v["group_size"]
    if g % CHUNK or tpg(g) > 16:
        return f"group_size={g}: needs a multiple of {CHUNK} up to {16 * CHUNK}"
    return None


def quant_tiers(dtype: str, wave: int, residual: bool = False) -> tuple[Tier, ...]:
    """The RMSNorm tiers, but without a residual, rows of 256 threads x 2 chunks (H 2049-4096)
    held by 128 threads x 4 chunks that sum as those 256 do (Tier.split), a row per block: the
    same bits, with the per-row work (reductions, divisions, square root, addresses) spread over
    twice the values, which pays where the grid is bound by instruction issue. Grids that fit at
    once keep the 256 x 2 kernel (the launcher), and so do rows with a residual, whose 4 chunks'
    registers cost more than they save (figures: docs/performance-history.md, session 28)."""
    return tuple(Tier(128, 4, 128, split=2)
                 if not residual and (t.tpr, t.items, t.two_pass) == (256, 2, False) else t
                 for t in tiers(dtype, wave))


def quant_context(v: Variant, table=None, staged=lambda t: False) -> dict:
    kind, _ = DTYPES[v["dtype"]]
    g = v["group_size"]
    return dict(kind=kind, group_size=g, tpg=tpg(g), ue8m0=str(v["ue8m0"]).lower(),
                fp8_max=repr(float(v.fp8.max)), cvt_clamps=int(cvt_clamps(v)),
                **tier_context(v["dtype"], v.target.wave_size, tpg(g), table, staged))


def staging(target) -> tuple[int, Callable[[Tier], bool]]:
    """(STAGES, which tiers use it) of rmsnorm_group_quant.cu.j2: rows streamed through shared
    memory (rmsnorm_rows_staged), so that the next rows load during the quant arithmetic of this
    one; the launcher takes it only for grids larger than fit on the device at once. Measured on
    the H200 (bf16, G=128): it pays for rows of one or two waves (16384 x 1536, a wave per row:
    48 -> 39 us; the 128-thread register rows that now take H = 1536 do it in 27.5) and costs
    the 256-thread rows (4096 x 7168: 33.5 -> 36.7 us; 3 stages: 40.2), whose quant arithmetic,
    not their loads, sets the time. AMD keeps the register path (as rmsnorm:
    families/rmsnorm.py, staging)."""
    if target.is_hip:
        return 0, lambda t: False
    return 2, lambda t: not t.two_pass and target.wave_size <= t.tpr <= 64


def context(v: Variant) -> dict:
    n, staged = staging(v.target)
    table = quant_tiers(v["dtype"], v.target.wave_size, v["residual"])
    return dict(quant_context(v, table, staged), residual=str(v["residual"]).lower(), stages=n)
