"""Comparisons shared by the GPU (L5) and emulator (L4) parity tests, on any device."""
import math

import pytest
import torch

ULP_TOL = {torch.bfloat16: 1, torch.float16: 1, torch.float32: 8}
MANT = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}
MIN_EXP = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126}
MEASURED: dict[str, float] = {}   # largest error seen per check (ulps per name and dtype)


def ulps(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| in units of the last place of ref in ref's dtype."""
    if not y.numel():
        return 0.0
    r = ref.float()
    exp = (torch.frexp(r.abs())[1] - 1).clamp_min(MIN_EXP[ref.dtype])
    exp = torch.where(r == 0, MIN_EXP[ref.dtype], exp)     # 0: the smallest step there is
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
    # a rate of 0.1% of the bytes, three standard deviations over it allowed (on 1536 bytes,
    # 1.5 expected: 2 or 3 differ by chance)
    expected = 0.001 * q.numel()
    assert n <= expected + 3 * math.sqrt(expected) + 1 and worst <= 1, \
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
    """The GEMM contract against the fp64 reference (reference.gemm_errors): mean relative
    error < 1e-3, all finite, and every element within GEMM_ROW_TOL of its row's scale past a
    bf16 ulp (the largest excess seen is in MEASURED["gemm_row_excess"])."""
    from codegen import reference

    ref = reference.gemm_a8w8_blockscale(a, sa, b, sb)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all(), "NaN/inf in the output (unwritten or overflowed)"
    err, worst, (i, j) = reference.gemm_errors(out, ref)
    assert err < reference.GEMM_MEAN_TOL, err
    if worst > reference.GEMM_ROW_TOL:
        raise AssertionError(f"out[{i}, {j}] = {out[i, j].item()}, reference {ref[i, j].item()}: "
                             f"{worst:.3g} of its row's mean |ref| past a bf16 ulp")
    if out.numel():
        MEASURED["gemm_row_excess"] = max(MEASURED.get("gemm_row_excess", -1.0), worst)
    return err


def check_gemm_unaligned_k(a, sa, b, sb) -> None:
    """A and B whose K is no multiple of 16, handed over as unaligned views (one byte past a
    16-byte boundary) of rows whose bytes past K are NaN: the op reads them as rows padded with
    zero columns to the next multiple of 16, bit for bit the GEMM of such rows, and meets the
    contract; nothing past K is read."""
    from codegen import ops

    k = a.shape[1]
    assert k % 16, k
    k16 = -(-k // 16) * 16

    def in_nan_rows(t):
        nan = 0x80 if t.dtype == torch.float8_e4m3fnuz else 0x7F
        store = torch.full((t.shape[0], k16 + 1), nan, dtype=torch.uint8, device=t.device)
        view = store[:, 1:k + 1].view(t.dtype)
        view.copy_(t)
        return view

    def zero_padded(t):
        out = torch.zeros((t.shape[0], k16), dtype=torch.uint8, device=t.device).view(t.dtype)
        out[:, :k] = t
        return out

    out = ops.gemm_a8w8_blockscale(in_nan_rows(a), sa, in_nan_rows(b), sb)
    assert torch.equal(out, ops.gemm_a8w8_blockscale(zero_padded(a), sa, zero_padded(b), sb))
    check_gemm(out, a, sa, b, sb)


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


def check_aiter_entry_points(device: str) -> None:
    """codegen.aiter against the ops it is made of, bit for bit, with AITER's conventions: FP8
    max torch.finfo(dtype).max, new outputs with the inputs left as they were, column-major
    scales behind a contiguous [T, G] view (transpose_scale), one launch or two for the fused
    norm + quant. device: "cuda", or "cpu" with an emulated device attached."""
    from codegen import aiter, ops, reference

    from .gpu_data import poison_, rows_with_spread

    t, h, h2, eps = 37, 512, 256, 1e-6
    x = rows_with_spread(t, h, torch.bfloat16, device=device)
    w = torch.rand(h, device=device).to(torch.bfloat16) + 0.5
    fp8 = ops.per_token_group_quant_fp8(x[:1], 128)[0].dtype
    fmax = torch.finfo(fp8).max
    rq, rs = reference.group_quant_fp8(x, 128, fp8, fmax)

    # quant: row-major scales, and column-major ones behind a contiguous [T, G] view
    q, s = aiter.get_hip_quant(aiter.QuantType.per_1x128)(x, quant_dtype=fp8)
    assert_quant_exact(q, s, rq, rs)
    q3, s3 = aiter.per_group_quant_hip(x.view(1, t, h), quant_dtype=fp8, transpose_scale=True)
    assert q3.shape == (1, t, h) and s3.shape == (1, t, h // 128) and s3.is_contiguous()
    assert_same(q3.view(t, h), rq, "per_group_quant_hip q")
    assert_same(s3.view(t, h // 128), rs.t().contiguous().view(t, h // 128),
                "transpose_scale: column-major scales")

    # norms: new outputs; with_add reads input and residual_in and writes the two outputs
    x0, res = x.clone(), rows_with_spread(t, h, torch.bfloat16, device=device)
    res0 = res.clone()
    assert_same(aiter.rms_norm(x, w, eps), ops.rmsnorm(x, w, eps), "rms_norm")
    out = poison_(torch.empty(1, t, h, dtype=x.dtype, device=device))
    assert aiter.rms_norm_cu(out, x.view(1, t, h), w, eps) is None
    assert_same(out.view(t, h), ops.rmsnorm(x, w, eps), "rms_norm_cu into out")
    out, res_out = torch.empty_like(x), torch.empty_like(x)
    assert aiter.rmsnorm2d_fwd_with_add(out, x, res, res_out, w, eps, 0) is None
    r2 = res0.clone()
    assert_same(out, ops.fused_add_rmsnorm(x0, r2, w, eps), "rmsnorm2d_fwd_with_add out")
    assert_same(res_out, r2, "rmsnorm2d_fwd_with_add residual_out")
    assert_same(x, x0, "input left as it was")
    assert_same(res, res0, "residual_in left as it was")
    # vLLM's in-place form, input's rows apart: written back through its strides
    wide, r2 = rows_with_spread(t, 2 * h, torch.bfloat16, device=device), res0.clone()
    before, r3 = wide.clone(), res0.clone()
    aiter.fused_add_rms_norm_cu(wide[:, :h], r2, w, eps)
    assert_same(wide[:, :h], ops.fused_add_rmsnorm(before[:, :h], r3, w, eps), "strided input")
    assert_same(r2, r3, "strided input: residual")
    assert torch.equal(wide[:, h:], before[:, h:]), "past the strided rows"

    # fused norm + quant: the one-launch MLA form, then the two-launch one (residual, the
    # unquantized copy, a second epsilon)
    kv = rows_with_spread(t, h2, torch.bfloat16, device=device)
    kvw = torch.rand(h2, device=device).to(torch.bfloat16) + 0.5
    single = ops.rmsnorm_group_quant(x, w, eps, 128, fp8_max=fmax)
    (fq, fs), out1, out2, out_res = aiter.fused_rms_fp8_group_quant(
        x, w, eps, kv, kvw, eps, dtype_quant=fp8, transpose_scale=True, is_x_scale_strided=True)
    assert out1 is None and out_res is None and fs.stride() == (1, t)
    assert_same(fq, single[0], "fused_rms_fp8_group_quant q")
    assert_same(fs, single[1], "fused_rms_fp8_group_quant scales")
    assert_same(out2, ops.rmsnorm(kv, kvw, eps), "fused_rms_fp8_group_quant out2")
    r3 = res0.clone()
    ref_q, ref_s, ref_y = ops.rmsnorm_group_quant(x, w, eps, 128, residual=r3, fp8_max=fmax,
                                                  also_return_unquantized=True)
    (fq, fs), out1, out2, out_res = aiter.fused_rms_fp8_group_quant(
        x, w, eps, kv, kvw, 1e-5, res1=res, output_unquantized_inp1=True)
    assert_same(fq, ref_q, "with res1: q")
    assert_same(fs, ref_s, "with res1: scales")
    assert_same(out1, ref_y, "with res1: out1")
    assert_same(out_res, r3, "with res1: out_res1")
    assert_same(out2, ops.rmsnorm(kv, kvw, 1e-5), "with res1: out2 (its own epsilon)")
    assert_same(res, res0, "res1 left as it was")
    # an fp32 inp2: out2 comes in inp1's dtype, as AITER's
    kv32, kvw32 = kv.float(), kvw.float()
    out2 = aiter.fused_rms_fp8_group_quant(x, w, eps, kv32, kvw32, eps, dtype_quant=fp8)[2]
    assert out2.dtype == torch.bfloat16
    assert_same(out2, ops.rmsnorm(kv32, kvw32, eps).bfloat16(), "fp32 inp2: out2")

    # GEMM: the quant's scales as they are; fp16 out is the bf16 result converted
    b, sb = quant_blocks(torch.randn(200, h, device=device) * 0.05, 128, fp8, fmax)
    y = aiter.gemm_a8w8_blockscale(q, b, s, sb)
    check_gemm(y, q, s, b, sb)
    assert_same(y, ops.gemm_a8w8_blockscale(q, s, b, sb), "gemm_a8w8_blockscale")
    y16 = aiter.gemm_a8w8_blockscale(q, b, s, sb, dtype=torch.float16)
    assert_same(y16, y.to(torch.float16), "gemm_a8w8_blockscale fp16")


def check_vllm_entry_points(device: str) -> None:
    """codegen.vllm against the ops it is made of, bit for bit, with vLLM's conventions: its
    scale layouts (column-major, TMA-aligned), out_q, [..., H] inputs, norms written into out or
    in place (input's rows strided too), weight None as ones, the residual updated in place, and
    the GEMM's fp16 default as the bf16 result converted. device: "cuda", or "cpu" with an
    emulated device attached."""
    from codegen import ops, reference, vllm

    from .gpu_data import poison_

    bf, eps = torch.bfloat16, 1e-6

    def rows(t, h):
        return torch.randn(t, h, device=device).to(bf)

    # quant: row-major, column-major and TMA-aligned scales; into out_q; [..., K] input
    m, k = 37, 512
    x = rows(m, k)
    fp8 = ops.per_token_group_quant_fp8(x[:1], 128)[0].dtype
    rq, rs = reference.group_quant_fp8(x, 128, fp8, 224.0 if fp8 == torch.float8_e4m3fnuz
                                       else 448.0)
    for col, tma in ((False, False), (False, True), (True, False), (True, True)):
        q, s = vllm.per_token_group_quant_fp8(x, 128, column_major_scales=col,
                                              tma_aligned_scales=tma)
        assert s.shape == (m, k // 128)
        assert s.stride() == ((1, (m + 3) // 4 * 4 if tma else m) if col else (k // 128, 1))
        assert_quant_exact(q, s, rq, rs)
    out_q = poison_(torch.empty_like(rq))
    q2, _ = vllm.per_token_group_quant_fp8(x, 128, out_q=out_q, column_major_scales=True)
    assert q2 is out_q
    assert_same(q2, rq, "out_q")
    q3, s3 = vllm.per_token_group_quant_fp8(x.view(1, m, k), 128)
    assert q3.shape == (1, m, k) and s3.shape == (1, m, k // 128)
    assert_quant_exact(q3.view(m, k), s3.view(m, k // 128), rq, rs)
    q8, s8 = vllm.per_token_group_quant_fp8(x, 64, use_ue8m0=True)
    uq, us = ops.per_token_group_quant_fp8(x, 64, ue8m0=True)
    assert_same(q8, uq, "use_ue8m0 q")
    assert_same(s8, us, "use_ue8m0 scales")

    # norms: into out, weight None as ones; fused add in place, input's rows strided too
    t, h = 13, 1024
    x, w = rows(t, h), torch.rand(h, device=device).to(bf) + 0.5
    out = poison_(torch.empty_like(x))
    assert vllm.rms_norm(out, x, w, eps) is None
    assert_same(out, ops.rmsnorm(x, w, eps), "rms_norm out")
    vllm.rms_norm(out.view(1, t, h), x.view(1, t, h), None, eps)
    assert_same(out, ops.rmsnorm(x, torch.ones_like(w), eps), "rms_norm weight=None")
    res = rows(t, h)
    inp, r2 = x.clone(), res.clone()
    vllm.fused_add_rms_norm(inp, res, w, eps)
    assert_same(inp, ops.fused_add_rmsnorm(x, r2, w, eps), "fused_add_rms_norm input")
    assert_same(res, r2, "fused_add_rms_norm residual")
    wide, res = rows(t, 2 * h), x.clone()
    inp, r2, before = wide[:, :h], res.clone(), wide.clone()
    vllm.fused_add_rms_norm(inp, res, w, eps)
    assert_same(inp, ops.fused_add_rmsnorm(before[:, :h], r2, w, eps), "strided input")
    assert_same(res, r2, "strided input: residual")
    assert torch.equal(wide[:, h:], before[:, h:]), "past the strided rows"

    # norm + quant: every scale layout; [..., H] input with the residual updated in place
    t = 21
    x = rows(t, h)
    rq, rs = ops.rmsnorm_group_quant(x, w, eps, 128)
    for transposed, tma in ((False, 0), (False, 4), (True, 0), (True, 4)):
        q, s = vllm.rms_norm_per_block_quant(x, w, eps, fp8, [1, 128],
                                             is_scale_transposed=transposed, tma_alignment=tma)
        assert_same(q, rq, "rms_norm_per_block_quant q")
        assert_same(s.contiguous(), rs, "rms_norm_per_block_quant scales")
        assert s.stride() == ((1, 24 if tma else 21) if transposed else (8, 1))
    with pytest.raises(ValueError, match="^quant_dtype: "):
        vllm.rms_norm_per_block_quant(x, w, eps, torch.int8, [1, 128])
    r = rows(t, h)
    r_want = reference.residual_add(x, r)
    q3, s3 = vllm.rms_norm_per_block_quant(x.view(3, 7, h), w, eps, fp8, [1, 64],
                                           residual=r.view(3, 7, h), is_scale_transposed=True)
    gq, gs = ops.rmsnorm_group_quant(r_want, w, eps, 64, scale_layout="col")
    assert q3.shape == (3, 7, h) and s3.shape == (t, h // 64) and s3.stride() == (1, t)
    assert_same(q3.view(t, h), gq, "q of [..., H] input")
    assert_same(s3, gs, "scales of [..., H] input")
    assert_same(r, r_want, "residual of [..., H] input")

    # GEMM: [..., K] A; bf16, fp32 and the fp16 default, each the bf16 result converted
    a = rows(10, k)
    qa, sa = vllm.per_token_group_quant_fp8(a.view(2, 5, k), 128)
    b, sb = quant_blocks(torch.randn(200, k, device=device) * 0.05, 128, fp8,
                         torch.finfo(fp8).max)
    y = ops.gemm_a8w8_blockscale(qa.view(10, k), sa.view(10, -1), b, sb)
    check_gemm(y, qa.view(10, k), sa.view(10, -1), b, sb)
    c = vllm.w8a8_triton_block_scaled_mm(qa, b, sa, sb, [128, 128], output_dtype=bf)
    assert c.shape == (2, 5, 200)
    assert_same(c.view(10, 200), y, "w8a8_triton_block_scaled_mm")
    for dtype, got in ((torch.float16, vllm.w8a8_block_fp8_matmul(qa, b, sa, sb, [128, 128])),
                       (torch.float32, vllm.w8a8_triton_block_scaled_mm(
                           qa, b, sa, sb, [128, 128], output_dtype=torch.float32))):
        assert got.dtype == dtype
        assert_same(got.view(10, 200), y.to(dtype), f"{dtype} out")


def check_residual_out(device: str, hs, t: int, dtypes=(torch.bfloat16,), quant=True) -> None:
    """fused_add_rmsnorm and rmsnorm_group_quant writing the sum to residual_out: the bits of the
    in-place form, x and residual left as they were, residual_out's strided rows written and
    nothing beside them; residual_out=residual is the in-place form. Rows of each length in hs
    (multiples of 128 also take the fused quant if quant), then the scalar path (rows off 16
    bytes)."""
    from codegen import ops

    from .gpu_data import poison_, rows_with_spread

    eps = 1e-6
    for dt in dtypes:
        for h in hs:
            x, res = (rows_with_spread(t, h, dt, device=device) for _ in range(2))
            w = (torch.rand(h, device=device) + 0.5).to(dt)
            x0, res0 = x.clone(), res.clone()
            buf = poison_(torch.empty(t, h + 16, dtype=dt, device=device))
            out = buf[:, 8:8 + h]                 # rows 16-byte aligned, stride past H
            summed = res0.clone()
            want = ops.fused_add_rmsnorm(x, summed, w, eps)
            what = f"{dt} T={t} H={h}"
            assert_same(ops.fused_add_rmsnorm(x, res, w, eps, residual_out=out), want,
                        f"{what}: y")
            assert_same(out, summed, f"{what}: residual_out")
            assert bits(buf[:, :8]).eq(-1).all() and bits(buf[:, 8 + h:]).eq(-1).all(), \
                f"{what}: written beside residual_out's rows"
            assert_same(res, res0, f"{what}: residual left as it was")
            assert_same(x, x0, f"{what}: x left as it was")
            same = res0.clone()
            assert_same(ops.fused_add_rmsnorm(x, same, w, eps, residual_out=same), want,
                        f"{what}: residual_out=residual")
            assert_same(same, summed, f"{what}: residual_out=residual, in place")
            if not quant or h % 128 or dt == torch.float32:
                continue
            r_in_place = res0.clone()
            q0, s0 = ops.rmsnorm_group_quant(x, w, eps, 128, residual=r_in_place)
            poison_(buf)
            q, s = ops.rmsnorm_group_quant(x, w, eps, 128, residual=res, residual_out=out)
            assert_same(q, q0, f"{what}: fused quant q")
            assert_same(s, s0, f"{what}: fused quant scales")
            assert_same(out, r_in_place, f"{what}: fused quant residual_out")
            assert_same(res, res0, f"{what}: fused quant residual left as it was")
        # the scalar path: rows that start off 16 bytes
        h = 1000
        x, res = (rows_with_spread(t, h + 8, dt, device=device)[:, 3:3 + h] for _ in range(2))
        w = (torch.rand(h, device=device) + 0.5).to(dt)
        res0 = res.clone()
        buf = poison_(torch.empty(t, h + 8, dtype=dt, device=device))
        out = buf[:, 1:1 + h]
        summed = res0.clone()
        want = ops.fused_add_rmsnorm(x, summed, w, eps)
        assert_same(ops.fused_add_rmsnorm(x, res, w, eps, residual_out=out), want,
                    f"{dt} scalar path: y")
        assert_same(out, summed, f"{dt} scalar path: residual_out")
        assert_same(res, res0, f"{dt} scalar path: residual left as it was")
        assert bits(buf[:, :1]).eq(-1).all() and bits(buf[:, 1 + h:]).eq(-1).all(), \
            f"{dt} scalar path: written beside residual_out's rows"
