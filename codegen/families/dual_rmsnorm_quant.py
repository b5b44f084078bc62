"""DeepSeek MLA's two norms in one launch: decisions for dual_rmsnorm_group_quant.cu.j2.

The first blocks normalize + group-quantize q, the others normalize kv; each part picks its own
RMSNorm tier (families/rmsnorm.py) at run time inside the one kernel, so q's bits equal
rmsnorm_group_quant's and kv's equal rmsnorm's. Only the 256-thread tiers that hold a row in
registers are offered (H <= 8192: MLA's latents are 1536 and 512): one block size for both
parts, and launch bounds of 256 leave the register-heavy tiers their registers (a 1024-thread
bound would cap them at 64 on sm_90a and spill).
"""
from __future__ import annotations

import ctypes
from functools import cache

from ..spec import Variant
from .rmsnorm import CHUNK, tiers
from .rmsnorm_quant import quant_context, validate  # noqa: F401  (same rules)

BLOCK = 256

# launcher(q, q_weight, q_fp8, q_scales, kv, kv_weight, kv_out, rows, h_q, h_kv,
#          q_row_stride_bytes, kv_row_stride_bytes, scale_row_stride, scale_col_stride, eps,
#          stream); returns cudaErrorInvalidValue for rows longer than max_h().
ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float,
            ctypes.c_void_p]


def dual_tiers(dtype: str, wave: int):
    return [t for t in tiers(dtype, wave) if t.block == BLOCK and not t.two_pass]


@cache
def max_h(dtype: str, wave: int) -> int:
    """Longest row (elements) of q or kv the dual kernel takes."""
    return dual_tiers(dtype, wave)[-1].cap * CHUNK


def context(v: Variant) -> dict:
    wave = v.target.wave_size
    ctx = quant_context(v, dual_tiers(v["dtype"], wave))
    return dict(ctx, block=BLOCK, max_h=max_h(v["dtype"], wave))
