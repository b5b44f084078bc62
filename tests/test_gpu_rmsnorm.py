"""L5: the RMSNorm family on the GPU (docs/numerics.md, "RMSNorm family").

- normalized values vs the torch reference: max error <= 1 ulp of the output dtype for bf16 /
  fp16 (fp32 output, outside the contract: <= 8 ulp); the measured maxima are printed and, when
  $OUT is set, written to $OUT/rmsnorm_ulp.json;
- fused vs the project's own unfused kernels composed, bit for bit: rmsnorm_group_quant(x) ==
  per_token_group_quant_fp8(rmsnorm(x.float(), w.float())) (the fused kernel quantizes the fp32
  normalized values, and every RMSNorm kernel sums a row in the same order whatever its dtype),
  fused_add_rmsnorm == residual add then rmsnorm, dual == rmsnorm_group_quant(q) + rmsnorm(kv);
- quantized outputs vs the torch reference: at most 0.1% of bytes differ, each by one fp8 step.
"""
import json
import os

import pytest
import torch

from codegen import ops, reference
from codegen.ops.quant import empty_scales

from .checks import (MEASURED, assert_same, check_fused_quant, check_residual_out, check_ulps,
                     check_vs_reference_quant)
from .gpu_data import fp8_info, poison_pool, rows_with_spread

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = 1e-6
H_ODD = [64, 769, 1536, 5125, 7168, 8192, 16384, 32768]
T_ODD = [0, 1, 7, 83, 2050]


@pytest.fixture(scope="module", autouse=True)
def report_ulps():
    yield
    print("\nRMSNorm max error vs reference (ulp of the output dtype):",
          json.dumps(MEASURED, sort_keys=True))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "rmsnorm_ulp.json"), "w") as f:
            json.dump(MEASURED, f, indent=1, sort_keys=True)


def data(t: int, h: int, dtype) -> torch.Tensor:
    """rows_with_spread, kept within fp16's range (x + residual included)."""
    x = rows_with_spread(t, h, torch.float32)
    if dtype == torch.float16:
        x = x.clamp(-3e4, 3e4)
    return x.to(dtype)


def weight(h: int, dtype) -> torch.Tensor:
    return (1 + 0.5 * torch.randn(h, device="cuda")).to(dtype)




# ---- rmsnorm ----

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("h", H_ODD)
@pytest.mark.parametrize("t", T_ODD)
def test_rmsnorm_parity(dtype, h, t):
    dt = DTYPES[dtype]
    x, w = data(t, h, dt), weight(h, dt)
    poison_pool(t * h * x.element_size())
    y = ops.rmsnorm(x, w, EPS)
    assert y.shape == (t, h) and y.is_contiguous()
    check_ulps("rmsnorm", y, reference.rmsnorm(x, w, EPS))
    if dt != torch.float32 and t:
        # the fp32 kernel sums a row in the same order: its output rounds to the same bits
        assert_same(ops.rmsnorm(x.float(), w.float(), EPS).to(dt), y, "fp32 vs " + dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
# 2048: fp32 rows whose shared-memory pipeline would need more than a block may have (the
# launcher must fall back, without a failed call left behind)
@pytest.mark.parametrize("h", [64, 769, 1536, 2048, 5125, 8192, 32768])
@pytest.mark.parametrize("t", [0, 1, 83, 2050])
def test_fused_add_rmsnorm(dtype, h, t):
    dt = DTYPES[dtype]
    x, w = data(t, h, dt), weight(h, dt)
    residual = data(t, h, dt)
    x0, r0 = x.clone(), residual.clone()
    poison_pool(t * h * x.element_size())
    y = ops.fused_add_rmsnorm(x, residual, w, EPS)
    ry, rr = reference.fused_add_rmsnorm(x0, r0, w, EPS)
    assert_same(residual, rr, "residual written in place")
    assert_same(x, x0, "x untouched")
    check_ulps("fused_add_rmsnorm", y, ry)
    assert_same(y, ops.rmsnorm(rr, w, EPS), "fused_add_rmsnorm vs add then rmsnorm")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("h", [1536, 769])
def test_strided_and_misaligned_rows(dtype, h):
    """Row strides >= H, offsets that break 16-byte alignment (the scalar path): same bits."""
    dt = DTYPES[dtype]
    base = data(37, h + 24, dt)
    w = weight(h, dt)
    for x in (base[:, :h], base[:, 8:8 + h], base[:, 1:1 + h], base[::2, 3:3 + h]):
        y = ops.rmsnorm(x, w, EPS)
        assert_same(y, ops.rmsnorm(x.contiguous(), w, EPS), f"strides {x.stride()}")
        check_ulps("rmsnorm_strided", y, reference.rmsnorm(x, w, EPS))
    # a misaligned weight
    w_buf = weight(h + 1, dt)
    assert_same(ops.rmsnorm(base[:, :h], w_buf[1:], EPS),
                ops.rmsnorm(base[:, :h], w_buf[1:].clone(), EPS), "misaligned weight")
    # a strided, misaligned residual is updated in place, rows only
    rbuf = data(37, h + 24, dt)
    residual, r0, x = rbuf[:, 3:3 + h], rbuf.clone(), base[:, :h]
    y = ops.fused_add_rmsnorm(x, residual, w, EPS)
    rr = reference.residual_add(x, r0[:, 3:3 + h])
    assert_same(residual, rr, "strided residual")
    assert_same(rbuf[:, :3], r0[:, :3], "outside the residual view")
    assert_same(rbuf[:, 3 + h:], r0[:, 3 + h:], "outside the residual view")
    assert_same(y, ops.rmsnorm(rr, w, EPS), "strided fused_add_rmsnorm")


def test_large_t():
    x, w = data(65536, 4096, torch.bfloat16), weight(4096, torch.bfloat16)
    y = ops.rmsnorm(x, w, EPS)
    check_ulps("rmsnorm_large", y, reference.rmsnorm(x, w, EPS))


def test_fp32_rows_of_one_value():
    """Where the per-thread sums drift most: the 8-ulp contract holds up to H = 65536."""
    h = 1 << 16
    for value in (0.1, 1.1, 3.3, 9.1):
        x, w = torch.full((2, h), value, device="cuda"), torch.ones(h, device="cuda")
        check_ulps("rmsnorm_one_value", ops.rmsnorm(x, w, EPS), reference.rmsnorm(x, w, EPS))


# More row groups than blocks fit on the device at once: only then do the launchers stream rows
# through shared memory (where the target does: on the H200, rmsnorm with 1024-thread rows,
# here 16384, and rmsnorm_group_quant with rows of up to 64 threads, here 128 and 1536), and the
# buffers wrap around many times; the register kernels then prefetch later rows into L2 (sm_90a),
# following the row stride (32768: the kernels that read each row twice).
@pytest.mark.parametrize("t,h", [(40000, 128), (40000, 1536), (16384, 4096), (4096, 7168),
                                 (2048, 16384), (1024, 32768)])
def test_many_rows_per_block(t, h):
    x, w = data(t, h, torch.bfloat16), weight(h, torch.bfloat16)
    y = ops.rmsnorm(x, w, EPS)
    check_ulps("rmsnorm_many_rows", y, reference.rmsnorm(x, w, EPS))
    assert_same(y, ops.rmsnorm(x.float(), w.float(), EPS).to(x.dtype), "bf16 vs fp32 rows")
    run_fused_quant(x, w, 128, "row", False, False)
    res = data(t, h, torch.bfloat16)
    r0 = res.clone()
    y2 = ops.fused_add_rmsnorm(x, res, w, EPS)
    assert_same(res, reference.residual_add(x, r0), "residual written in place")
    assert_same(y2, ops.rmsnorm(res, w, EPS), "fused_add vs add then rmsnorm")
    run_fused_quant(x, w, 128, "col_tma", False, True)
    xs = data(t, h + 16, torch.bfloat16)[:, 8:8 + h]  # rows 16-byte aligned, stride > H
    assert_same(ops.rmsnorm(xs, w, EPS), ops.rmsnorm(xs.contiguous(), w, EPS), "strided rows")
    run_fused_quant(xs, w, 128, "row", False, True)


def test_row_lengths_alternating():
    """One kernel launched for a row length, a shorter one, then the first again: kernels that
    stream rows through shared memory size it per call (and cache what the device allows)."""
    for h in (16384, 12288, 16384, 7168, 4096, 7168):
        # 1024 rows: more blocks than fit at once, else the register kernels take them
        x, w = data(1024, h, torch.bfloat16), weight(h, torch.bfloat16)
        assert_same(ops.rmsnorm(x, w, EPS), ops.rmsnorm(x.float(), w.float(), EPS).to(x.dtype),
                    f"rmsnorm h={h}")
        for with_residual in (False, True):
            run_fused_quant(x, w, 128, "row", False, with_residual)


# ---- rmsnorm_group_quant ----

def run_fused_quant(x, w, g, layout, ue8m0, with_residual):
    """The fused op, checked against the unfused ops composed (bit-exact) and the reference."""
    fp8_dtype, fmax = fp8_info()
    t, h = x.shape
    residual = data(t, h, x.dtype) if with_residual else None
    r0 = residual.clone() if with_residual else None
    poison_pool(t * h, empty_scales(t, h // g, layout, x).untyped_storage().nbytes(),
                t * h * x.element_size())
    q, s, y = ops.rmsnorm_group_quant(x, w, EPS, g, residual=residual, scale_layout=layout,
                                      ue8m0=ue8m0, also_return_unquantized=True)
    assert q.shape == (t, h) and q.dtype == fp8_dtype and s.shape == (t, h // g)
    assert s.stride() == empty_scales(t, h // g, layout, x).stride()
    check_fused_quant("rmsnorm_group_quant_y", (q, s, y), x, w, EPS, g, layout, ue8m0, residual,
                      r0, fp8_dtype, fmax)
    # without the unquantized output: the same bytes, written over poison (the blocks the
    # checks above freed hold them already)
    r2 = r0.clone() if with_residual else None
    poison_pool(t * h, empty_scales(t, h // g, layout, x).untyped_storage().nbytes())
    q2, s2 = ops.rmsnorm_group_quant(x, w, EPS, g, residual=r2, scale_layout=layout, ue8m0=ue8m0)
    assert_same(q2, q, "q without y")
    assert_same(s2, s, "scales without y")
    return q, s


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("layout", ["row", "col", "col_tma"])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_group_quant_every_variant(dtype, g, layout, ue8m0, with_residual):
    dt = DTYPES[dtype]
    x, w = data(83, 1536, dt), weight(1536, dt)
    run_fused_quant(x, w, g, layout, ue8m0, with_residual)


@pytest.mark.parametrize("h", [128, 1536, 2176, 3072, 4096, 7168, 8192, 16384, 32768])
@pytest.mark.parametrize("t", T_ODD)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_group_quant_shapes(h, t, with_residual):
    x, w = data(t, h, torch.bfloat16), weight(h, torch.bfloat16)
    run_fused_quant(x, w, 128, "col_tma", False, with_residual)


@pytest.mark.parametrize("h", [32, 800, 1568, 3104, 6176, 12320, 16416])
def test_rmsnorm_group_quant_g32_every_row_tier(h):
    x, w = data(37, h, torch.bfloat16), weight(h, torch.bfloat16)
    run_fused_quant(x, w, 32, "col", False, h in (800, 3104, 12320))


def test_rmsnorm_group_quant_misaligned_input():
    base = data(19, 2048 + 8, torch.bfloat16)
    w = weight(2048, torch.bfloat16)
    x = base[:, 1:1 + 2048]                      # rows not 16-byte aligned: copied first
    q, s = ops.rmsnorm_group_quant(x, w, EPS, 128)
    q2, s2 = ops.rmsnorm_group_quant(x.contiguous(), w, EPS, 128)
    assert_same(q, q2, "misaligned x")
    assert_same(s, s2, "misaligned x scales")


# ---- dual_rmsnorm_group_quant ----

@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("layout", ["row", "col", "col_tma"])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_dual_matches_separate_ops(dtype, g, layout, ue8m0):
    dt = DTYPES[dtype]
    t = 83
    # MLA: q latent [T, 1536]; kv latent [T, 512] as a slice of [T, 576] (kv + rope)
    q = data(t, 1536, dt)
    kv = data(t, 576, dt)[:, :512]
    qw, kvw = weight(1536, dt), weight(512, dt)
    poison_pool(t * 1536, empty_scales(t, 1536 // g, layout, q).untyped_storage().nbytes(),
                t * 512 * q.element_size())
    q8, qs, kvn = ops.dual_rmsnorm_group_quant(q, qw, kv, kvw, EPS, g, scale_layout=layout,
                                               ue8m0=ue8m0)
    sq, ss = ops.rmsnorm_group_quant(q, qw, EPS, g, scale_layout=layout, ue8m0=ue8m0)
    assert_same(q8, sq, "dual q vs rmsnorm_group_quant")
    assert_same(qs, ss, "dual scales vs rmsnorm_group_quant")
    assert qs.stride() == ss.stride()
    assert_same(kvn, ops.rmsnorm(kv, kvw, EPS), "dual kv vs rmsnorm")
    fp8_dtype, fmax = fp8_info()
    rq, rs, rkv = reference.dual_rmsnorm_group_quant(q, qw, kv, kvw, EPS, g, fp8_dtype, fmax,
                                                     ue8m0)
    check_vs_reference_quant(q8, qs, rq, rs, ue8m0)
    check_ulps("dual_kv", kvn, rkv)


@pytest.mark.parametrize("hq,hkv", [(1536, 512), (128, 8192), (3072, 512), (7168, 64),
                                    (8192, 1536)])
@pytest.mark.parametrize("t", T_ODD)
def test_dual_shapes(hq, hkv, t):
    q, kv = data(t, hq, torch.bfloat16), data(t, hkv, torch.bfloat16)
    qw, kvw = weight(hq, torch.bfloat16), weight(hkv, torch.bfloat16)
    q8, qs, kvn = ops.dual_rmsnorm_group_quant(q, qw, kv, kvw, EPS, 128, scale_layout="col_tma")
    assert q8.shape == (t, hq) and qs.shape == (t, hq // 128) and kvn.shape == (t, hkv)
    sq, ss = ops.rmsnorm_group_quant(q, qw, EPS, 128, scale_layout="col_tma")
    assert_same(q8, sq, "dual q")
    assert_same(qs, ss, "dual scales")
    assert_same(kvn, ops.rmsnorm(kv, kvw, EPS), "dual kv")


# Rows of each tier kind; then more rows than fit on the device at once, where the launchers
# stream rows through shared memory (rmsnorm_group_quant at 128 and 1536, rmsnorm at 16384).
@pytest.mark.parametrize("t,hs", [(5, (256, 1536, 3072, 7168, 17408)), (40000, (128, 1536)),
                                  (2048, (16384,))])
def test_residual_out(t, hs):
    check_residual_out("cuda", hs, t, (torch.bfloat16, torch.float16, torch.float32))


# ---- torch.compile, graphs, errors ----

def test_torch_compile_fullgraph():
    x, w = data(64, 2048, torch.bfloat16), weight(2048, torch.bfloat16)
    ops.rmsnorm(x, w, EPS)      # eager first: device caches filled, kernels loaded
    f = torch.compile(lambda a, b: ops.rmsnorm(a, b, EPS), fullgraph=True)
    assert_same(f(x, w), ops.rmsnorm(x, w, EPS), "compiled rmsnorm")

    r = data(64, 2048, torch.bfloat16)
    r_eager, r_compiled = r.clone(), r.clone()
    g = torch.compile(lambda a, res, b: ops.fused_add_rmsnorm(a, res, b, EPS), fullgraph=True)
    assert_same(g(x, r_compiled, w), ops.fused_add_rmsnorm(x, r_eager, w, EPS),
                "compiled fused_add_rmsnorm")
    assert_same(r_compiled, r_eager, "compiled residual update")

    r_out = torch.empty_like(r)
    g = torch.compile(lambda a, res, b, out: ops.fused_add_rmsnorm(a, res, b, EPS,
                                                                  residual_out=out),
                      fullgraph=True)
    assert_same(g(x, r, w, r_out), ops.fused_add_rmsnorm(x, r.clone(), w, EPS),
                "compiled fused_add_rmsnorm, residual_out")
    assert_same(r_out, r_eager, "compiled residual_out")


def test_torch_compile_fused_quant_with_residual():
    x, w = data(64, 2048, torch.bfloat16), weight(2048, torch.bfloat16)
    r = data(64, 2048, torch.bfloat16)
    r_eager, r_compiled = r.clone(), r.clone()
    ops.rmsnorm_group_quant(x, w, EPS, 128, residual=r.clone())    # eager first (caches)
    f = torch.compile(lambda a, b, res: ops.rmsnorm_group_quant(
        a, b, EPS, 128, residual=res, scale_layout="col_tma", also_return_unquantized=True),
        fullgraph=True)
    got = f(x, w, r_compiled)
    want = ops.rmsnorm_group_quant(x, w, EPS, 128, residual=r_eager, scale_layout="col_tma",
                                   also_return_unquantized=True)
    for a, b, what in zip(got, want, ("q", "scales", "y")):
        assert_same(a, b, f"compiled {what}")
    assert_same(r_compiled, r_eager, "compiled residual update")
    r_out = torch.empty_like(r)
    f = torch.compile(lambda a, b, res, out: ops.rmsnorm_group_quant(
        a, b, EPS, 128, residual=res, residual_out=out, scale_layout="col_tma"),
        fullgraph=True)
    for a, b, what in zip(f(x, w, r, r_out), want, ("q", "scales")):
        assert_same(a, b, f"compiled with residual_out: {what}")
    assert_same(r_out, r_eager, "compiled residual_out")


def test_graph_capture():
    static_x = data(64, 1536, torch.bfloat16)
    w = weight(1536, torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.rmsnorm_group_quant(static_x, w, EPS, 128)      # build / load outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gq, gs = ops.rmsnorm_group_quant(static_x, w, EPS, 128)
    static_x.copy_(data(64, 1536, torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    q, s = ops.rmsnorm_group_quant(static_x, w, EPS, 128)
    assert_same(gq, q, "graph q")
    assert_same(gs, s, "graph scales")


def test_empty():
    for dt in (torch.bfloat16, torch.float32):
        x, w = torch.empty(0, 512, device="cuda", dtype=dt), weight(512, dt)
        assert ops.rmsnorm(x, w).shape == (0, 512)
        assert ops.fused_add_rmsnorm(x, x.clone(), w).shape == (0, 512)
    x, w = torch.empty(0, 512, device="cuda", dtype=torch.bfloat16), weight(512, torch.bfloat16)
    q, s, y = ops.rmsnorm_group_quant(x, w, EPS, 128, scale_layout="col",
                                      also_return_unquantized=True)
    assert q.shape == (0, 512) and s.shape == (0, 4) and y.shape == (0, 512)
    kv, kvw = torch.empty(0, 64, device="cuda", dtype=torch.bfloat16), weight(64, torch.bfloat16)
    q8, qs, kvn = ops.dual_rmsnorm_group_quant(x, w, kv, kvw, EPS, 128)
    assert q8.shape == (0, 512) and qs.shape == (0, 4) and kvn.shape == (0, 64)


def test_checks_still_hold_after_a_good_call():
    """Checks are kept per call signature (dtypes, devices, sizes past the rows, strides): what
    changes with T alone must still be caught on later calls."""
    bf = torch.bfloat16
    x, w = data(4, 256, bf), weight(256, bf)
    kv, kvw = data(4, 512, bf), weight(512, bf)
    ops.dual_rmsnorm_group_quant(x, w, kv, kvw)
    with pytest.raises(ValueError, match="kv: 3 rows"):
        ops.dual_rmsnorm_group_quant(x, w, kv[:3], kvw)
    r = data(4, 256, bf)
    ops.fused_add_rmsnorm(x, r, w)
    with pytest.raises(ValueError, match="residual: shape"):
        ops.fused_add_rmsnorm(x, r[:3], w)
    ops.rmsnorm_group_quant(x, w, residual=r)
    with pytest.raises(ValueError, match="residual: shape"):
        ops.rmsnorm_group_quant(x, w, residual=r[:3])
    # a last dim that is not contiguous passes with no rows, and must not with one
    nc = torch.randn(256, 2, device="cuda", dtype=bf).t()
    ops.rmsnorm(nc[:0], w)
    with pytest.raises(ValueError, match="x: last dim must be contiguous"):
        ops.rmsnorm(nc[:1], w)


def test_bad_input_names_the_argument():
    x, w = data(4, 256, torch.bfloat16), weight(256, torch.bfloat16)
    with pytest.raises(TypeError, match="x: dtype"):
        ops.rmsnorm(x.to(torch.int32), w)
    with pytest.raises(TypeError, match="weight: dtype"):
        ops.rmsnorm(x, w.half())
    with pytest.raises(ValueError, match="weight: shape"):
        ops.rmsnorm(x, w[:128])
    with pytest.raises(ValueError, match="x: last dim must be contiguous"):
        ops.rmsnorm(torch.randn(256, 4, device="cuda").t(), w.float())
    with pytest.raises(ValueError, match="x: must be on a GPU"):
        ops.rmsnorm(x.cpu(), w)
    with pytest.raises(ValueError, match="x: hidden size must be > 0"):
        ops.rmsnorm(x[:, :0], w[:0])
    with pytest.raises(ValueError, match="x: row stride"):
        ops.rmsnorm(x.as_strided((4, 256), (128, 1)), w)
    with pytest.raises(ValueError, match="eps"):
        ops.rmsnorm(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="residual: shape"):
        ops.fused_add_rmsnorm(x, x[:, :128].clone(), w)
    with pytest.raises(TypeError, match="residual: dtype"):
        ops.fused_add_rmsnorm(x, x.half(), w)
    with pytest.raises(TypeError, match="x: dtype"):
        ops.rmsnorm_group_quant(x.float(), w.float())
    with pytest.raises(ValueError, match="group_size"):
        ops.rmsnorm_group_quant(x, w, EPS, 16)
    with pytest.raises(ValueError, match="multiple of group_size"):
        ops.rmsnorm_group_quant(x[:, :200], w[:200])
    with pytest.raises(ValueError, match="scale_layout"):
        ops.rmsnorm_group_quant(x, w, scale_layout="diag")
    with pytest.raises(ValueError, match="fp8_max"):
        ops.rmsnorm_group_quant(x, w, fp8_max=100.0)
    rbuf = data(4, 264, torch.bfloat16)
    with pytest.raises(ValueError, match="residual: rows must start on 16-byte"):
        ops.rmsnorm_group_quant(x, w, residual=rbuf[:, 1:257])
    kv, kvw = data(4, 512, torch.bfloat16), weight(512, torch.bfloat16)
    with pytest.raises(ValueError, match="kv: 3 rows"):
        ops.dual_rmsnorm_group_quant(x, w, kv[:3], kvw)
    with pytest.raises(ValueError, match="q: hidden size 200"):
        ops.dual_rmsnorm_group_quant(x[:, :200], w[:200], kv, kvw)
    with pytest.raises(ValueError, match="kv: hidden size 100"):
        ops.dual_rmsnorm_group_quant(x, w, kv[:, :100], kvw[:100])
    with pytest.raises(ValueError, match="kv_weight: shape"):
        ops.dual_rmsnorm_group_quant(x, w, kv, kvw[:256])
    big, bigw = data(4, 16384, torch.bfloat16), weight(16384, torch.bfloat16)
    with pytest.raises(ValueError, match="q: hidden size 16384 exceeds"):
        ops.dual_rmsnorm_group_quant(big, bigw, kv, kvw)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_rmsnorm_keeps_the_sign_of_zero(dtype):
    """y of x = -0 is -0 (w > 0), on 16-byte rows and on the scalar path."""
    base, w = data(3, 1024 + 8, DTYPES[dtype]), weight(1024, DTYPES[dtype]).abs()
    base[:, ::3] = -0.0
    for x in (base[:, :1024], base[:, 3:1027]):
        zero = x == 0
        assert_same(ops.rmsnorm(x, w, EPS)[zero], x[zero], f"{dtype}: signs of zero")
