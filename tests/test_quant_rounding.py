"""CPU check, in exact arithmetic, of how the quant kernels divide (group_quant.cuh, quotient).

The kernels take x / scale as q0 = RN(x y) with y = RN(1 / scale), then correct it twice with
fma residuals: q = RN(q - RN(q scale - x) y). NUMERICS.md asks for the IEEE quotient RN(x / scale)
(then clamp and round to fp8). This replays those steps with exact rationals, rounding to
float32 after each operation as the hardware does, and asks for RN(x / scale) bit for bit:
around every fp8 rounding midpoint and value for many scales (the structured ones of bf16 data
too: x and amax with 8-bit significands, scale = RN(amax / fp8_max)), and on random pairs. The
steps and their number are read from the header, so the header is what is checked.
"""
import random
import re
import struct
from fractions import Fraction as F
from functools import cache

import pytest

from codegen.render import INCLUDE_DIR

HEADER = (INCLUDE_DIR / "codegen" / "group_quant.cuh").read_text()


@cache
def header_corrections() -> int:
    """How many corrections quotient() applies; fails if its steps are not the ones replayed."""
    assert "return {div_rn(1.0f, scale), inf ? 0.0f : scale};" in HEADER   # y = RN(1 / scale)
    m = re.search(r"float q = x \* d\.y;\s*#pragma unroll\s*for \(int i = 0; i < (\d+); \+\+i\) "
                  r"q = fma_rn\(-fma_rn\(q, d\.scale, -x\), d\.y, q\);", HEADER)
    assert m, "quotient() in group_quant.cuh is not q = x * y, then q = fma(-fma(q, s, -x), y, q)"
    return int(m.group(1))


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
