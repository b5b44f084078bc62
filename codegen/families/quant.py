"""Per-token-group FP8 quant: decisions for group_quant_fp8.cu.j2."""
from __future__ import annotations

import ctypes

from ..spec import Variant

# dtype -> (template KIND, bytes per element)
DTYPES = {"bf16": (0, 2), "fp16": (1, 2), "fp32": (2, 4)}
BLOCK = 256
ITEMS = 1
LOADS = 2        # 16-byte loads per lane and group for large problems (small ones take 1)
# Grid cap in multiples of the resident blocks (0: one block per batch, no cap). With the
# division's exact path gone the kernel is memory-bound, and one batch per block is faster than a
# capped grid that loads its next batch ahead (H200, bf16, G=128, cap 2 -> none: 8192x7168
# 51.7 -> 49.8 us, 16384x4096 59.0 -> 56.9, 8192x16384 111.7 -> 108.3; tools/tune_quant.py).
GRID_WAVES = 0

# launcher(x, q, scales, num_groups, groups_per_row, x_row_stride_bytes, scale_col_stride,
#          grid_waves, stream)
ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]


def vec(dtype: str) -> int:
    return 16 // DTYPES[dtype][1]


def loads(v: Variant) -> int:
    """16-byte loads per lane: LOADS where the group is big enough, else 1."""
    n = vec(v["dtype"])
    return LOADS if v["group_size"] % (n * LOADS) == 0 else 1


def validate(v: Variant) -> str | None:
    g, n = v["group_size"], vec(v["dtype"]) * loads(v)
    if g % n:
        return f"group_size={g} is not a multiple of the {n}-element vector of {v['dtype']}"
    if g // n > v.target.wave_size:
        return f"group_size={g} needs {g // n} lanes, more than a wave of {v.target.wave_size}"
    return None


def context(v: Variant) -> dict:
    kind, _ = DTYPES[v["dtype"]]
    n = vec(v["dtype"])
    return dict(kind=kind, group_size=v["group_size"], vec=n, loads=loads(v), block=BLOCK,
                items=ITEMS, ue8m0=str(v["ue8m0"]).lower(),
                col_scales=str(v["scale_layout"] != "row").lower(),
                fp8_max=repr(float(v.fp8.max)), cvt_clamps=int(cvt_clamps(v)))


def cvt_clamps(v: Variant) -> bool:
    """Whether the fp8 convert saturates at the scaling max, making our clamp redundant:
    sm_90a's cvt.rn.satfinite saturates at the format's max (448 for e4m3fn), maps NaN to NaN
    and inf to +-448, which is what clamp-then-convert gives when the scaling max is 448."""
    return v.target.vendor == "nvidia" and v.fp8.name == "e4m3fn" and v.fp8.max == 448.0
