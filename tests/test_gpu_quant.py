"""L5: the generated quant kernels vs the torch reference on the GPU, bit-exact."""
import pytest
import torch

from codegen import ops, reference
from codegen.ops.quant import empty_scales

from .checks import assert_quant_exact
from .gpu_data import boundary_rows, fp8_info, poison_pool, rows_with_spread

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}




def run_and_check(x, g, layout, ue8m0, fp8_max=None):
    fp8_dtype, default_max = fp8_info()
    fmax = fp8_max or default_max
    t, h = x.shape
    poison_pool(t * h, empty_scales(t, h // g, layout, x).untyped_storage().nbytes())
    q, s = ops.per_token_group_quant_fp8(x, g, scale_layout=layout, ue8m0=ue8m0,
                                         fp8_max=fp8_max)
    rq, rs = reference.group_quant_fp8(x, g, fp8_dtype, fmax, ue8m0)
    assert q.shape == (t, h) and s.shape == (t, h // g)
    if layout == "row":
        assert s.stride() == (h // g, 1)
    else:
        pad = t if layout == "col" else (t + 3) // 4 * 4
        assert s.stride() == (1, pad)
    assert_quant_exact(q, s, rq, rs)
    return q, s


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("layout", ["row", "col", "col_tma"])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_every_variant_bit_exact(dtype, g, layout, ue8m0):
    x = rows_with_spread(83, 1536, DTYPES[dtype])
    run_and_check(x, g, layout, ue8m0)


@pytest.mark.parametrize("t", [1, 7, 83, 2050])
@pytest.mark.parametrize("h", [1536, 7168, 16384])
def test_odd_shapes(t, h):
    x = rows_with_spread(t, h, torch.bfloat16)
    run_and_check(x, 128, "col_tma", False)
    run_and_check(x, 64, "row", True)


def test_strided_rows_and_zero_group():
    base = rows_with_spread(37, 4096 + 256, torch.bfloat16)
    x = base[:, :4096]                      # row stride 4352
    x[3, :128] = 0                          # an all-zero group: scale = eps / max, q = 0
    q, s = run_and_check(x, 128, "row", False)
    assert (q[3, :128].view(torch.uint8) == 0).all()




@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("g", [32, 64, 128])
def test_quotients_on_rounding_boundaries(dtype, g):
    fp8_dtype, fmax = fp8_info()
    x = boundary_rows(512, g, DTYPES[dtype], fmax, fp8_dtype == torch.float8_e4m3fnuz)
    run_and_check(x, g, "row", False)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("g", [32, 128])
def test_few_boundary_values_per_wave(dtype, g):
    """Random groups with a few values on or beside rounding midpoints, at densities from a
    handful of lanes per wave to most of them, among values far from any: every quotient must
    give the reference's bytes however many of a wave's values sit at a boundary."""
    fp8_dtype, fmax = fp8_info()
    t = 256
    edge = boundary_rows(t, g, DTYPES[dtype], fmax, fp8_dtype == torch.float8_e4m3fnuz)
    edge = edge.float().repeat(1, 4)                       # four groups per row
    amax = edge.abs().amax(dim=1, keepdim=True)
    gen = torch.Generator(device="cuda").manual_seed(g)
    noise = torch.randn(edge.shape, device="cuda", generator=gen) * amax / 8
    density = torch.tensor([0.001, 0.004, 0.01, 0.03, 0.1, 0.5], device="cuda")
    pick = torch.rand(edge.shape, device="cuda", generator=gen) < density[torch.arange(t) % 6, None]
    keep = edge.abs() == amax                              # each group's amax stays
    x = torch.where(pick | keep, edge, noise.clamp(-amax, amax))
    run_and_check(x.to(DTYPES[dtype]), g, "row", False)


def test_scale_reciprocal_is_ieee_over_its_range():
    """The group scale's 1 / scale on sm_90a (rcp_rn_mid, arch_cuda.cuh): MUFU's approximate
    reciprocal and one fma step, without rcp.rn's range test. Replayed here with the same
    instructions for every float32 of biased exponent 1-252 (the scales' range, [1e-10 / fp8_max,
    FLT_MAX / fp8_max], lies inside) against IEEE division: equal bit for bit."""
    triton = pytest.importorskip("triton")
    import triton.language as tl
    from codegen.render import INCLUDE_DIR

    if torch.version.hip:
        pytest.skip("HIP divides (arch_hip.h)")
    header = (INCLUDE_DIR / "codegen" / "arch_cuda.cuh").read_text()
    assert 'asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));' in header
    assert "return __fmaf_rn(r, __fmaf_rn(-s, r, 1.0f), r);" in header

    @triton.jit
    def both(s_ptr, y_ptr, ieee_ptr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        s = tl.load(s_ptr + i)
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [s],
                                      dtype=tl.float32, is_pure=True, pack=1)
        tl.store(y_ptr + i, tl.fma(r, tl.fma(-s, r, 1.0), r))
        tl.store(ieee_ptr + i, tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s))

    n = 1 << 23
    mantissa = torch.arange(n, device="cuda", dtype=torch.int32)
    y, ieee = (torch.empty(n, device="cuda") for _ in range(2))
    for e in range(1, 253):
        s = (mantissa | (e << 23)).view(torch.float32)
        both[(n // 1024,)](s, y, ieee, BLOCK=1024)
        bad = (y.view(torch.int32) != ieee.view(torch.int32)).nonzero()
        assert bad.numel() == 0, \
            f"1 / {s[bad[0]].item()!r}: {y[bad[0]].item()!r}, IEEE {ieee[bad[0]].item()!r}"


def test_empty_and_large():
    q, s = ops.per_token_group_quant_fp8(torch.empty(0, 512, device="cuda", dtype=torch.bfloat16))
    assert q.shape == (0, 512) and s.shape == (0, 4)
    x = rows_with_spread(65536, 16384, torch.bfloat16)   # 2^30 elements
    run_and_check(x, 128, "row", False)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("ue8m0", [False, True])
def test_nan_and_inf_follow_reference(dtype, ue8m0):
    x = rows_with_spread(8, 256, DTYPES[dtype])
    x[0, 5] = float("nan")
    x[1, 200] = float("inf")
    x[2, 7] = -float("inf")
    fp8_dtype, fmax = fp8_info()
    q, s = ops.per_token_group_quant_fp8(x, 128, ue8m0=ue8m0)
    rq, rs = reference.group_quant_fp8(x, 128, fp8_dtype, fmax, ue8m0)
    assert torch.isnan(s[0, 0]) and torch.isinf(s[1, 1])
    # NaN bytes may differ in sign between the reference and the hardware: compare as floats
    torch.testing.assert_close(q.float(), rq.float(), equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(s, rs, equal_nan=True, rtol=0, atol=0)


def test_bad_input_names_the_argument():
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="x: dtype"):
        ops.per_token_group_quant_fp8(x.to(torch.int32))
    with pytest.raises(ValueError, match="multiple of group_size"):
        ops.per_token_group_quant_fp8(x[:, :200])
    with pytest.raises(ValueError, match="last dim must be contiguous"):
        ops.per_token_group_quant_fp8(torch.randn(256, 4, device="cuda").t())
    with pytest.raises(ValueError, match="must be on a GPU"):
        ops.per_token_group_quant_fp8(x.cpu())
    with pytest.raises(ValueError, match="group_size"):
        ops.per_token_group_quant_fp8(x, 96)
    with pytest.raises(ValueError, match="scale_layout"):
        ops.per_token_group_quant_fp8(x, scale_layout="diag")
    with pytest.raises(ValueError, match="fp8_max"):
        ops.per_token_group_quant_fp8(x, fp8_max=100.0)


def test_rows_off_16_byte_boundaries_are_copied_first():
    """x whose start or row stride is no multiple of 16 bytes (the kernel loads rows 16 bytes at
    a time): quantized from an aligned copy, on every eager path (the calls after the first find
    a plan); an out off a 16-byte boundary is refused."""
    base = rows_with_spread(33, 1536 + 4, torch.bfloat16)
    for x in (base[:, 4:4 + 1536],                                  # 8 bytes in, stride 3080
              base.view(-1)[4:4 + 33 * 1536].view(33, 1536)):       # 8 bytes in, contiguous
        for _ in range(3):
            run_and_check(x, 128, "row", False)
    fp8 = fp8_info()[0]
    out = torch.empty(33 * 1536 + 16, dtype=torch.uint8, device="cuda")[8:8 + 33 * 1536]
    with pytest.raises(ValueError, match="out: must start on a 16-byte boundary"):
        ops.per_token_group_quant_fp8(x, 128, out=out.view(fp8).view(33, 1536))


def test_into_out_eager_after_a_plan_and_compiled():
    """out= after calls of the same signature (whose plan the fast path holds) and under
    torch.compile: q lands in out, poisoned beforehand, bit-exact."""
    x = rows_with_spread(45, 2048, torch.bfloat16)
    for _ in range(3):
        q, s = ops.per_token_group_quant_fp8(x, 128, scale_layout="col")
    f = torch.compile(lambda a, o: ops.per_token_group_quant_fp8(a, 128, scale_layout="col",
                                                                 out=o), fullgraph=True)
    for call in (lambda o: ops.per_token_group_quant_fp8(x, 128, scale_layout="col", out=o),
                 lambda o: f(x, o)):
        out = torch.full_like(q.view(torch.uint8), 0x7F).view(q.dtype)
        q2, s2 = call(out)
        assert q2.data_ptr() == out.data_ptr() and s2.stride() == s.stride()
        assert torch.equal(out.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s2, s)
    with pytest.raises(ValueError, match="out: .*torch.bfloat16"):
        ops.per_token_group_quant_fp8(x, 128, out=torch.empty_like(x))


def test_torch_compile_and_graph_capture():
    x = rows_with_spread(64, 2048, torch.bfloat16)
    eager = ops.per_token_group_quant_fp8(x, 128, scale_layout="col_tma")
    f = torch.compile(lambda a: ops.per_token_group_quant_fp8(a, 128, scale_layout="col_tma"),
                      fullgraph=True)
    compiled = f(x)
    assert torch.equal(compiled[0].view(torch.uint8), eager[0].view(torch.uint8))
    assert torch.equal(compiled[1], eager[1])

    static_x = x.clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.per_token_group_quant_fp8(static_x, 128)     # warm up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gq, gs = ops.per_token_group_quant_fp8(static_x, 128)
    static_x.copy_(rows_with_spread(64, 2048, torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    rq, rs = ops.per_token_group_quant_fp8(static_x, 128)
    assert torch.equal(gq.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(gs, rs)


JIT_SNIPPET = """
import torch, codegen.build.jit as jit
from codegen import ops, reference
x = torch.randn(33, 384, device="cuda", dtype=torch.bfloat16)
q, s = ops.per_token_group_quant_fp8(x, 32, scale_layout="col_tma", ue8m0=True)
rq, rs = reference.group_quant_fp8(x, 32, q.dtype, 224.0 if q.dtype == torch.float8_e4m3fnuz else 448.0, True)
assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
print(jit.BUILDS)
"""


def test_eight_processes_cold_cache(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, CODEGEN_CACHE_DIR=str(tmp_path), CODEGEN_AOT_DIR=str(tmp_path / "aot"))
    procs = [subprocess.Popen([sys.executable, "-c", JIT_SNIPPET], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(8)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert sum(int(o[0].split()[-1]) for o in outs) == 1


COMPILED_FIRST = """
import torch
from codegen import ops
w = torch.rand(2048, device="cuda", dtype=torch.bfloat16) + 0.5
def step(x):
    q, s = ops.rmsnorm_group_quant(x, w, 1e-6, 128, scale_layout="col_tma")
    return (q, s, *ops.per_token_group_quant_fp8(x, 128))
f = torch.compile(step, fullgraph=True, dynamic=True)
x = torch.randn(37, 2048, device="cuda", dtype=torch.bfloat16)
bits = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t
for a, b in zip(f(x), step(x)):
    assert a.stride() == b.stride() and torch.equal(bits(a), bits(b)), "compiled != eager"
print("ok")
"""


def test_compiled_before_any_eager_call():
    """A fresh process whose first calls are traced: the checks run in full under dynamo
    (no cache filled by an eager call before), with a symbolic T."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", COMPILED_FIRST], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
