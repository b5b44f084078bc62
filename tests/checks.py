"""Comparisons shared by the GPU (L5) and emulator (L4) parity tests, on any device."""
import torch

ULP_TOL = {torch.bfloat16: 1, torch.float16: 1, torch.float32: 8}
MANT = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}
MIN_EXP = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126}
MEASURED: dict[str, float] = {}   # largest ulp error seen per check name and dtype


def ulps(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| in units of the last place of ref in ref's dtype."""
    if not y.numel():
        return 0.0
    r = ref.float()
    exp = (torch.frexp(r.abs())[1] - 1).clamp_min(MIN_EXP[ref.dtype])
    ulp = torch.ldexp(torch.ones_like(r), exp - MANT[ref.dtype])
    return ((y.float() - r).abs() / ulp).max().item()


def check_ulps(name: str, y: torch.Tensor, ref: torch.Tensor) -> None:
    assert y.shape == ref.shape and y.dtype == ref.dtype
    assert not torch.isnan(y).any(), f"{name}: unwritten (NaN) outputs"
    u = ulps(y, ref)
    key = f"{name}_{str(ref.dtype).removeprefix('torch.')}"
    MEASURED[key] = max(MEASURED.get(key, 0.0), u)
    assert u <= ULP_TOL[ref.dtype], f"{name}: {u} ulp"


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, what
    diff = (bits(a) != bits(b)).sum().item()
    assert diff == 0, f"{what}: {diff} elements differ"


def fp8_steps(q: torch.Tensor, ref: torch.Tensor) -> tuple[int, int]:
    """(bytes that differ, largest difference in fp8 steps) between two fp8 tensors."""
    def ordered(t):
        b = t.contiguous().view(torch.uint8).int()
        return torch.where(b >= 128, 128 - b, b)     # sign-magnitude to a signed scale
    d = (ordered(q) - ordered(ref)).abs()
    return (d > 0).sum().item(), (d.max().item() if d.numel() else 0)


def check_vs_reference_quant(q, s, rq, rs, ue8m0: bool) -> None:
    n, worst = fp8_steps(q, rq)
    # 0.1% of the bytes, and at least one byte for tensors under 1000 bytes
    assert n <= max(1, 0.001 * q.numel()) and worst <= 1, \
        f"{n} of {q.numel()} bytes differ, up to {worst} fp8 steps"
    if ue8m0:
        same = (s.contiguous() == rs).float().mean().item() if s.numel() else 1.0
        assert same >= 0.999, f"{1 - same:.2%} of power-of-two scales differ"
    else:
        torch.testing.assert_close(s.contiguous(), rs, rtol=1e-5, atol=0)


def assert_quant_exact(q, s, rq, rs) -> None:
    """The quant contract: every byte and every scale bit equal to the reference's."""
    assert q.shape == rq.shape and q.dtype == rq.dtype
    diff = (q.view(torch.uint8) != rq.view(torch.uint8)).sum().item()
    assert diff == 0, f"{diff} differing bytes"
    assert torch.equal(s.contiguous().view(torch.int32), rs.view(torch.int32)), "scales differ"


def quant_blocks(x: torch.Tensor, rows: int, dtype, fmax: float, cols: int = 128):
    """x [R, C] -> (fp8, fp32 scales [ceil(R/rows), ceil(C/cols)]), one scale per block."""
    from codegen.nn import quantize_weight

    return quantize_weight(x, dtype, fmax, (rows, cols))


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).abs().mean() / ref.float().abs().mean()).item()


def check_gemm(out, a, sa, b, sb) -> float:
    """The GEMM contract: mean relative error < 1e-3 against the fp64 reference, all finite."""
    from codegen import reference

    ref = reference.gemm_a8w8_blockscale(a, sa, b, sb)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all(), "NaN/inf in the output (unwritten or overflowed)"
    err = rel_err(out, ref)
    assert err < 1e-3, err
    return err


def check_fused_quant(name, outputs, x, w, eps, g, layout, ue8m0, residual, r0, fp8_dtype,
                      fmax) -> None:
    """rmsnorm_group_quant's (q, s, y) against the unfused ops composed, bit for bit (the same
    kernels' arithmetic: fp32 rmsnorm, then the quant kernel), and against the reference;
    residual: the tensor the op updated in place (r0 its value before), or None."""
    from codegen import ops, reference

    q, s, y = outputs
    r = reference.residual_add(x, r0) if residual is not None else x
    if residual is not None:
        assert_same(residual, r, "residual written in place")
    uq, us = ops.per_token_group_quant_fp8(ops.rmsnorm(r.float(), w.float(), eps), g,
                                           scale_layout=layout, ue8m0=ue8m0)
    assert_same(q, uq, "q vs unfused")
    assert_same(s, us, "scales vs unfused")
    assert s.stride() == us.stride()
    assert_same(y, ops.rmsnorm(r, w, eps), "y vs rmsnorm")
    rq, rs, ry, _ = reference.rmsnorm_group_quant(x, w, eps, g, fp8_dtype, fmax, ue8m0, r0)
    check_vs_reference_quant(q, s, rq, rs, ue8m0)
    check_ulps(name, y, ry)
