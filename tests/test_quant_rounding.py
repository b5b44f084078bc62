"""CPU proof of the quant fast path's test (templates/include/codegen/group_quant.cuh).

The kernels take x / scale as y = x * (1/scale), within 4 ulps of the IEEE quotient, and redo a
lane by IEEE division only when midpoint_distance(y) == 0 or |y| < kSmallQuotient. This checks,
for both fp8 formats, that every y the test lets through rounds to the same fp8 value as every
float within 4 ulps of it: exhaustively around each rounding midpoint and fp8 value, and on a
large random sample. The test's constants are read from the header, so the header is what is
checked.
"""
import re

import numpy as np
import pytest
import torch

from codegen.render import INCLUDE_DIR

HEADER = (INCLUDE_DIR / "codegen" / "group_quant.cuh").read_text()


def header_constants() -> tuple[int, int, float]:
    """(added, mask, small) of: return (float_to_bits(y) + added) & mask; kSmallQuotient."""
    m = re.search(r"midpoint_distance\(float y\) \{\s*return \(float_to_bits\(y\) \+ \(([^)]*)\)\) "
                  r"& (0x[0-9a-f]+)u;", HEADER)
    assert m, "midpoint_distance not found in group_quant.cuh"
    added = eval(m.group(1).replace("u", "")) & 0xFFFFFFFF   # e.g. "8u - 0x80000u"
    small = re.search(r"kSmallQuotient = ([0-9a-fx.p+-]+)f;", HEADER).group(1)
    return added, int(m.group(2), 16), float.fromhex(small)


def passes_fast_path(bits: np.ndarray) -> np.ndarray:
    added, mask, small = header_constants()
    y = bits.view(np.float32)
    return (((bits + np.uint32(added)) & np.uint32(mask)) != 0) & (np.abs(y) >= small)


def to_fp8(y: np.ndarray, dtype, fmax: float) -> np.ndarray:
    v = torch.from_numpy(np.clip(y, -fmax, fmax).astype(np.float32))
    return v.to(dtype).view(torch.uint8).numpy()


@pytest.mark.parametrize("dtype,fmax", [(torch.float8_e4m3fn, 448.0),
                                        (torch.float8_e4m3fnuz, 224.0),
                                        (torch.float8_e4m3fnuz, 240.0)])
def test_fast_path_rounds_like_every_neighbour(dtype, fmax):
    # every fp8 value and midpoint between neighbours, +-40 ulps, and a random sample
    grid = torch.arange(256, dtype=torch.uint8).view(dtype).float().numpy()
    grid = np.unique(grid[np.isfinite(grid) & (np.abs(grid) <= fmax)])
    points = np.concatenate([grid, (grid[1:] + grid[:-1]) / 2]).astype(np.float32)
    near = (points.view(np.uint32)[:, None].astype(np.int64) + np.arange(-40, 41)).ravel()
    rng = np.random.default_rng(0)
    sample = rng.uniform(-fmax * 1.01, fmax * 1.01, 2_000_000).astype(np.float32)
    bits = np.concatenate([near[near >= 0].astype(np.uint32), sample.view(np.uint32)])
    bits = bits[passes_fast_path(bits)]
    y = bits.view(np.float32)
    assert len(y) > 1_000_000
    ref = to_fp8(y, dtype, fmax)
    for off in range(-4, 5):   # the IEEE quotient is within 4 ulps of y
        other = (bits.astype(np.int64) + off).astype(np.uint32).view(np.float32)
        differ = to_fp8(other, dtype, fmax) != ref
        assert not differ.any(), (off, y[differ][:5])


def test_the_check_can_fail():
    """Without the midpoint test (a mask that lets everything through) the proof must fail."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    grid = np.unique(grid[np.isfinite(grid) & (np.abs(grid) <= 448)])
    mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    mids = mids[np.abs(mids) >= 2 ** -6]
    below = (mids.view(np.uint32) - 1).view(np.float32)
    assert (to_fp8(mids, torch.float8_e4m3fn, 448) != to_fp8(below, torch.float8_e4m3fn, 448)).any()
    assert not passes_fast_path(mids.view(np.uint32)).any()
