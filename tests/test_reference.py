"""The torch references against values worked by hand: every kernel is held to these, so a
slip in one would pass every parity test (docs/numerics.md)."""
import math

import pytest
import torch

from codegen import reference as ref

E4M3 = torch.float8_e4m3fn


def test_pow2_ceil_is_exact_at_powers_of_two_and_keeps_non_finite():
    s = torch.tensor([1.0, 3.0, 0.75, 2.0**-10, 2.0**-10 * 1.0001, math.inf, math.nan])
    out = ref.pow2_ceil(s)
    assert out[:6].tolist() == [1.0, 4.0, 1.0, 2.0**-10, 2.0**-9, math.inf]
    assert math.isnan(out[6])


@pytest.mark.parametrize("ue8m0, scales, q", [
    (False, [2 / 448, 4 / 448], [224, -448, 56, 448]),
    (True, [2.0**-7, 2.0**-6], [128, -256, 32, 256])])
def test_group_quant_by_hand(ue8m0, scales, q):
    x = torch.tensor([[1.0, -2.0, 0.5, 4.0]])
    qq, s = ref.group_quant_fp8(x, 2, E4M3, 448.0, ue8m0)
    want = torch.tensor(scales, dtype=torch.float32)     # the fp32 quotient, not a reciprocal
    assert torch.equal(s, want[None]) and qq.float().tolist() == [q]


def test_group_quant_zero_nan_and_layout():
    x = torch.tensor([[0.0, 0.0, 1.0, 2.0], [3.0, math.nan, 7.0, 8.0]])
    q, s = ref.group_quant_fp8(x, 2, E4M3, 448.0)
    assert s.shape == (2, 2) and s.is_contiguous()                   # [T, H / G], row-major
    assert s[0, 0] == torch.tensor(1e-10) / torch.tensor(448.0) and q[0, :2].float().eq(0).all()
    assert s[0, 1] == torch.tensor(2.0) / torch.tensor(448.0)
    assert math.isnan(s[1, 0]) and s[1, 1] == torch.tensor(8.0) / torch.tensor(448.0)


def test_rmsnorm_family_by_hand():
    x = torch.tensor([[1.0, 1.0], [3.0, 4.0]], dtype=torch.bfloat16)
    w = torch.tensor([2.0, 3.0], dtype=torch.bfloat16)
    assert ref.rmsnorm(x[:1], w, eps=3.0).tolist() == [[1.0, 1.5]]      # 1 / sqrt(1 + 3)
    rms = math.sqrt(12.5)
    assert ref.rmsnorm_fp32(x[1:], w, eps=0.0)[0].tolist() == pytest.approx(
        [6 / rms, 12 / rms], rel=1e-6)
    r = torch.tensor([[1.0, 3.0], [-3.0, 0.5]], dtype=torch.bfloat16)
    y, new_r = ref.fused_add_rmsnorm(x, r, w, eps=0.0)
    assert new_r.tolist() == [[2.0, 4.0], [0.0, 4.5]]                   # x + residual
    assert torch.equal(y, ref.rmsnorm(new_r, w, eps=0.0))
    q, s, y2, r2 = ref.rmsnorm_group_quant(x, w, 0.0, 2, E4M3, 448.0, residual=r)
    assert torch.equal(r2, new_r) and torch.equal(y2, y)
    kv, kv_w = torch.ones(1, 2, dtype=torch.bfloat16), torch.tensor([5.0, 7.0]).bfloat16()
    assert ref.dual_rmsnorm_group_quant(x, w, kv, kv_w, 0.0, 2, E4M3, 448.0)[2].tolist() == \
        [[5.0, 7.0]]


def test_gemm_reference_takes_each_k_blocks_scales():
    a = torch.ones(2, 256).to(E4M3)
    b = torch.ones(256, 256).to(E4M3)
    a_scales = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b_scales = torch.tensor([[1.0, 10.0], [100.0, 1000.0]])
    out = ref.gemm_a8w8_blockscale(a, a_scales, b, b_scales)
    want = torch.empty(2, 256)
    for m in range(2):
        for n in range(256):
            want[m, n] = 128 * sum(a_scales[m, kb] * b_scales[n // 128, kb] for kb in range(2))
    assert torch.equal(out, want.to(torch.bfloat16))


def test_gemm_tolerances_and_errors():
    assert ref.GEMM_MEAN_TOL == 1e-3 and ref.GEMM_ROW_TOL == 2.0**-7   # numerics.md's
    r = torch.tensor([[1.0, 2.0], [4.0, 8.0]], dtype=torch.bfloat16)
    out = r.clone()
    out[1, 1] = 8 + 3 * 2.0**-4                                        # 3 bf16 ulps off
    mean, worst, where = ref.gemm_errors(out, r)
    assert mean == pytest.approx(0.1875 / 4 / 3.75)
    assert worst == pytest.approx((0.1875 - 8 * 2.0**-7) / 6) and where == (1, 1)
    assert worst > ref.GEMM_ROW_TOL
    out[1, 1] = 8 + 2.0**-4                                            # one ulp: allowed
    assert ref.gemm_errors(out, r)[1] == 0.0
