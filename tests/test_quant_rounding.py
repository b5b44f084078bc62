"""CPU check, in exact arithmetic, of how the quant kernels divide (group_quant.cuh): quotient(),
x / scale for every value, and div_by_fp8_max(), the group's scale amax / fp8_max.

The kernels take x / scale as q0 = RN(x y) with y = RN(1 / scale), then correct it once with an
fma residual: q = RN(q0 - RN(q0 scale - x) y). docs/numerics.md asks for the fp8 byte of the IEEE
quotient RN(x / scale) (clamped, then rounded to fp8). The correction leaves q faithful, and
RN(x / scale) unless x / scale lies within 2^-23 ulp of a float32 midpoint; so the byte can only
differ where such a midpoint is next to an fp8 rounding boundary. Those are checked for every
float32 significand of the scale (exponents scale each step exactly). Beside that, the steps are
replayed with exact rationals, rounding to float32 after each operation as the hardware does,
around every fp8 rounding midpoint and value for many scales (the structured ones of bf16 data
too: x and amax with 8-bit significands, scale = RN(amax / fp8_max)), and on random pairs. The
steps are read from the header, so the header is what is checked.

The scale's division has one divisor per fp8 format, so it is checked for every float32
significand instead.
"""
import random
import re
import struct
from fractions import Fraction as F
from functools import cache

import numpy as np
import pytest

from codegen.render import INCLUDE_DIR
from codegen.targets import TARGETS

HEADER = (INCLUDE_DIR / "codegen" / "group_quant.cuh").read_text()


@cache
def header_corrections() -> int:
    """How many corrections quotient() applies; fails if its steps are not the ones replayed."""
    # y = RN(1 / scale): rcp_rn_mid is, over the scales' range (tests/test_gpu_quant.py)
    assert "return {inf ? 0.0f : rcp_rn_mid(scale), inf ? 0.0f : scale};" in HEADER
    body = re.search(r"CG_DEVICE float quotient\(float x, Divisor d\) \{(.*?)\n\}", HEADER, re.S)
    assert body, "quotient() not found in group_quant.cuh"
    steps = " ".join(body.group(1).split())
    assert steps == ("const float q = x * d.y; return fma_rn(-fma_rn(q, d.scale, -x), d.y, q);"), \
        f"quotient() is not q = x * y, then fma(-fma(q, s, -x), y, q): {steps}"
    return 1


def bits(f: float) -> int:
    return struct.unpack("<I", struct.pack("<f", f))[0]


def from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def rn32(v: F, negative_zero: bool = False) -> float:
    """v rounded to the nearest float32, ties to even (subnormals included)."""
    if v == 0:
        return -0.0 if negative_zero else 0.0
    sign, a = (-1.0 if v < 0 else 1.0), abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += (F(2) ** (e + 1) <= a) - (F(2) ** e > a)
    ulp = F(2) ** (max(e, -126) - 23)
    n, rem = divmod(a, ulp)
    n += rem > ulp / 2 or (rem == ulp / 2 and n % 2 == 1)
    return sign * float(n * ulp) if n * ulp < F(2) ** 128 else sign * float("inf")


def fma(a: float, b: float, c: float) -> float:
    exact = F(a) * F(b) + F(c)
    # an exact zero sum is -0 only when both addends are -0 (round to nearest)
    both_negative = exact == 0 and (a * b == 0 and str(a * b)[0] == "-") and str(c)[0] == "-"
    return rn32(exact, both_negative)


def kernel_quotient(x: float, scale: float, corrections: int | None = None) -> float:
    y = rn32(F(1) / F(scale))
    q = rn32(F(x) * F(y), negative_zero=str(x)[0] == "-")
    for _ in range(header_corrections() if corrections is None else corrections):
        q = fma(-fma(q, scale, -x), y, q)
    return q


MIDPOINTS = [(1 + (2 * k + 1) / 16) * 2.0 ** e for e in range(-10, 9) for k in range(8)]
MIDPOINTS += [(k + 0.5) * 2.0 ** -9 for k in range(8)] + [(k + 0.5) * 2.0 ** -10 for k in range(8)]


def cases(n: int, seed: int):
    """(x, scale) pairs: x beside scale * m for fp8 midpoints and values m, bf16-like data, and
    random pairs; scales from 2^-42 (the 1e-10 floor over fp8_max) to 2^100."""
    rng = random.Random(seed)
    fp8_values = [m * 2 for m in MIDPOINTS] + [1.0, 448.0, 224.0, 240.0]
    for i in range(n):
        kind = i % 4
        scale = from_bits(rng.randrange(bits(2.0 ** -42), bits(2.0 ** 100)))
        if kind == 2:   # significands of all ones, all zeros, one bit
            scale = from_bits(rng.randrange(60, 200) << 23 | rng.choice(
                [0x7FFFFF, 0x7FFFFE, 0, 1, 0x400000, 0x200000, 0x600000, 0x124925]))
        if kind in (0, 2):
            m = rng.choice(MIDPOINTS if kind == 0 else fp8_values)
            x = from_bits(bits(rn32(F(m) * F(scale))) + rng.randint(-3, 3))
        elif kind == 1:   # bf16 data: 8-bit significands, scale = RN(amax / 448)
            amax = from_bits(rng.randrange(100, 150) << 23 | rng.randrange(128) << 16)
            scale = rn32(F(amax) / 448)
            x = from_bits(bits(amax) - (rng.randrange(0, 40) << 23) - (rng.randrange(128) << 16))
        else:
            x = rn32(F(rng.random()) * 448 * F(scale))
        yield (-x if rng.random() < 0.5 else x), scale


FP8_BOUNDARIES = sorted({1 + k / 16 for k in range(1, 16, 2)} | {1 + k / 8 for k in range(8)})


@pytest.mark.parametrize("m", FP8_BOUNDARIES)
def test_quotient_beside_every_fp8_boundary(m):
    """Every fp8 rounding boundary (significands: normal midpoints 1 + odd / 16; below the
    normal range, midpoints odd * 2^-10 and the zero / smallest-subnormal one) for every scale
    significand s: the float32 midpoints T beside the boundary, and x the float32 nearest s T,
    the only x whose quotient lies within 2^-23 ulp of T. There the kernel's quotient must be
    RN(x / s): then no fp8 byte differs from IEEE division's anywhere."""
    header_corrections()
    s = every_significand()
    y = (1.0 / s).astype(np.float32).astype(np.float64)
    ulp = 2.0 ** -23
    for t in (m + ulp / 2, m - (ulp / 4 if m == 1 else ulp / 2)):
        x = (s * t).astype(np.float32).astype(np.float64)        # s t is exact in float64
        ieee = (x / s).astype(np.float32)                        # double rounding innocuous
        q0 = (x * y).astype(np.float32).astype(np.float64)       # exact product, one rounding
        r = (q0 * s - x).astype(np.float32).astype(np.float64)   # exact residual, one rounding
        assert np.array_equal(round_sum(q0, -r * y), ieee), f"boundary {m}, T = {t!r}"


def round_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """RN32(a + b) for float64 a, b that are float32 / exact products: the float64 sum t and its
    error (TwoSum), the error deciding the side where t is halfway between two floats."""
    t = a + b
    bb = t - a
    err = (a - (t - bb)) + (b - bb)
    out = t.astype(np.float32)
    o = out.astype(np.float64)
    up, down = np.nextafter(out, np.float32(np.inf)), np.nextafter(out, np.float32(-np.inf))
    out = np.where((t == (o + up.astype(np.float64)) / 2) & (err > 0), up, out)
    return np.where((t == (o + down.astype(np.float64)) / 2) & (err < 0), down, out)


def test_the_boundary_check_can_fail():
    """The product alone (no correction) differs from RN(x / s) beside the boundaries."""
    s = every_significand()[::97]
    y = (1.0 / s).astype(np.float32).astype(np.float64)
    x = (s * (1.5 + 2.0 ** -24)).astype(np.float32).astype(np.float64)
    assert ((x * y).astype(np.float32) != (x / s).astype(np.float32)).sum() > 1000


@pytest.mark.parametrize("seed", [0, 1])
def test_quotient_is_the_ieee_quotient(seed):
    wrong = [(x, s) for x, s in cases(6000, seed)
             if bits(kernel_quotient(x, s)) != bits(rn32(F(x) / F(s)))]
    assert not wrong, [(x.hex(), s.hex()) for x, s in wrong[:5]]


def test_signed_zeros_and_tiny_values():
    for scale in (2.0 ** -42, 1.5, 3.0e30):
        assert bits(kernel_quotient(0.0, scale)) == bits(0.0)
        assert bits(kernel_quotient(-0.0, scale)) == bits(-0.0)
        for x in (1e-45, 1e-40, 1e-38, 2.0 ** -60):
            # far below any fp8 boundary: only the sign matters, and it must survive
            assert kernel_quotient(-x, scale) <= 0 and str(kernel_quotient(-x, scale))[0] == "-"
            assert kernel_quotient(x, scale) >= 0 and str(kernel_quotient(x, scale))[0] != "-"


def test_the_check_can_fail():
    """The product alone (no correction) is not the IEEE quotient on these cases: the test
    above would see a kernel that skipped the corrections."""
    wrong = sum(bits(kernel_quotient(x, s, corrections=0)) != bits(rn32(F(x) / F(s)))
                for x, s in cases(2000, 0))
    assert wrong > 100


# ---- div_by_fp8_max: amax / fp8_max for every significand ----

FP8_MAXIMA = sorted({f.max for t in TARGETS.values() for f in t.fp8_formats})


@cache
def header_scale_steps() -> None:
    """Fails if div_by_fp8_max() is not the sequence replayed below."""
    body = re.search(r"CG_DEVICE float div_by_fp8_max\(float a\) \{(.*?)\n\}", HEADER, re.S)
    assert body, "div_by_fp8_max() not found in group_quant.cuh"
    steps = " ".join(body.group(1).split())
    assert steps == ("constexpr float c = 1.0f / CG_FP8_MAX; "
                     "const float q = __builtin_fminf(a * c, 3.40282347e38f); "
                     "return fma_rn(fma_rn(-q, CG_FP8_MAX, a), c, q);"), steps


def kernel_scale(a: np.ndarray, fp8_max: float, correct: bool = True) -> np.ndarray:
    """div_by_fp8_max(a) replayed in float64, each step rounded to float32 as the GPU does. The
    products are exact in float64 (24-bit by 24-bit significands) and so is the residual (it
    cancels to a few bits); the last fma's sum is rounded exactly via TwoSum."""
    header_scale_steps()
    c = np.float64(np.float32(1.0) / np.float32(fp8_max))
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.minimum((a * c).astype(np.float32), np.float32(3.40282347e38)).astype(np.float64)
        if not correct:
            return q.astype(np.float32)
        r = (a - q * fp8_max).astype(np.float32).astype(np.float64)
        s = r * c
        t = q + s
        b = t - q
        err = (q - (t - b)) + (s - b)              # t + err == q + s exactly
        out = t.astype(np.float32)
        # t exactly halfway between two floats: the error, not ties-to-even, picks the side
        o = out.astype(np.float64)
        up = np.nextafter(out, np.float32(np.inf))
        down = np.nextafter(out, np.float32(-np.inf))
        out = np.where((t == (o + up.astype(np.float64)) / 2) & (err > 0), up, out)
        out = np.where((t == (o + down.astype(np.float64)) / 2) & (err < 0), down, out)
    return out


def every_significand() -> np.ndarray:
    """All float32 values in [1, 2), as float64."""
    return np.arange(1 << 23, 1 << 24, dtype=np.float64) / 2.0 ** 23


def ieee_scale(a: np.ndarray, fp8_max: float) -> np.ndarray:
    """RN(a / fp8_max). The float64 quotient rounds once more, which cannot move it across a
    float32 midpoint: fp8_max's odd part k > 1 would need a 24-bit a = k m for a 25-bit m; with
    k = 1 the quotient is exact."""
    return (a / fp8_max).astype(np.float32)


@pytest.mark.parametrize("fp8_max", FP8_MAXIMA)
def test_scale_division_is_ieee_for_every_significand(fp8_max):
    a = every_significand()
    got, want = kernel_scale(a, fp8_max), ieee_scale(a, fp8_max)
    wrong = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert wrong.size == 0, [float(a[i]).hex() for i in wrong[:5]]


@pytest.mark.parametrize("fp8_max", FP8_MAXIMA)
def test_scale_division_ends_of_range(fp8_max):
    a = np.array([1e-10, 3.40282347e38, np.inf, np.nan], dtype=np.float32).astype(np.float64)
    got = kernel_scale(a, fp8_max)
    want = ieee_scale(a, fp8_max)
    assert got[:3].view(np.uint32).tolist() == want[:3].view(np.uint32).tolist()
    assert got[2] == np.inf and np.isnan(got[3])


def test_scale_check_can_fail():
    """Without the correction, the product is off for about half of all significands."""
    a = every_significand()
    for fp8_max in FP8_MAXIMA:
        wrong = kernel_scale(a, fp8_max, correct=False) != ieee_scale(a, fp8_max)
        assert wrong.mean() > 0.25
