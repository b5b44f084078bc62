"""L4: the gfx code objects of every family executed in an AMD ISA emulator (codegen.emu).

The public ops run on CPU tensors with an emulated device attached: their checks, the shipped
launcher's grid / block / LDS decisions and the real code object, instruction by instruction.
Contracts as on the GPU (docs/numerics.md): quant and the RMSNorm family bit-exact (fused against
the unfused kernels composed, run in the emulator too), the GEMM within vLLM's tolerance.
Every output is allocated NaN-filled (torch's fill_uninitialized_memory), so an unwritten
element shows. Needs CODEGEN_AMD_EMULATOR (`make test-emu`); skips without it.
"""
import pytest
import torch

from codegen import emu, ops, reference
from codegen.families import gemm as gemm_family
from codegen.families import quant as quant_family
from codegen.families.rmsnorm import tier_for, tiers
from codegen.spec import make_variant, validate
from codegen.targets import get_target

from .checks import (assert_quant_exact, assert_same, check_aiter_entry_points, check_fused_quant,
                     check_gemm, check_gemm_unaligned_k, check_residual_out, check_ulps,
                     check_vllm_entry_points, quant_blocks, rel_err, ulps)
from .gpu_data import boundary_rows, rows_with_spread

pytestmark = pytest.mark.emu

# gfx1200 runs the same code as gfx1201 (test_isa.py::test_gfx1200_code_is_gfx1201s).
ARCHS = ["gfx942", "gfx950", "gfx1201"]
# RMSNorm's targets without FP8 too: gfx1100 on the RDNA3 model, gfx90a on the CDNA one
# (test_emu_rmsnorm_gfx90a_code_decodes_as_cdna3)
NORM_ARCHS = [*ARCHS, "gfx1100", "gfx90a"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = 1e-6
_sessions: dict = {}


@pytest.fixture(scope="module", autouse=True)
def poisoned_outputs():
    """Every new tensor starts NaN-filled (fp8: its NaN byte), so unwritten outputs show."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.utils.deterministic.fill_uninitialized_memory = before[1]
    emu.detach()


EXECUTED: dict[str, set] = {}      # test id -> variants (URIs) it ran, for the summary table


@pytest.fixture(autouse=True)
def record_variants(request):
    before = {k: len(s.launches()) for k, s in _sessions.items()}
    yield
    EXECUTED[request.node.nodeid] = {launch.uri for k, s in _sessions.items()
                                     for launch in s.launches()[before.get(k, 0):]}


def on(arch: str, cus: int = 4) -> emu.Session:
    """The ops run CPU tensors on this emulated device from now on (one session per size)."""
    key = (arch, cus)
    if key not in _sessions:
        _sessions[key] = emu.Session(emu.Device(arch, cus=cus, index=len(_sessions)))
    return emu.use(_sessions[key])


def fp8_of(arch: str):
    fmt = get_target(arch).fp8_format()
    return getattr(torch, fmt.torch_dtype), fmt.max


def launched(session: emu.Session, start: int) -> list:
    return session.launches()[start:]


# ---- per-token-group quant ----

# every (dtype, group size) once per arch, the scale layouts and ue8m0 spread over them
QUANT = [("bf16", 128, "row", False, 83, 1536), ("bf16", 64, "col_tma", True, 7, 896),
         ("bf16", 32, "col", False, 5, 160), ("fp16", 128, "col", True, 9, 640),
         ("fp16", 64, "row", False, 33, 384), ("fp16", 32, "col_tma", False, 3, 96),
         ("fp32", 128, "col_tma", False, 17, 768), ("fp32", 64, "col", True, 4, 256),
         ("fp32", 32, "row", True, 11, 224)]


def quant_id(c) -> str:
    return f"{c[0]}-g{c[1]}-{c[2]}{'-ue8m0' if c[3] else ''}"


def quant_and_check(arch, x, g, layout="row", ue8m0=False, fp8_max=None):
    dtype, fmax = fp8_of(arch)
    q, s = ops.per_token_group_quant_fp8(x, g, scale_layout=layout, ue8m0=ue8m0,
                                         fp8_max=fp8_max)
    rq, rs = reference.group_quant_fp8(x, g, dtype, fp8_max or fmax, ue8m0)
    assert s.stride() == ops.quant.empty_scales(x.shape[0], x.shape[1] // g, layout, x).stride()
    assert_quant_exact(q, s, rq, rs)
    return q, s


@pytest.mark.parametrize("case", QUANT, ids=quant_id)
@pytest.mark.parametrize("arch", ARCHS)
def test_emu_quant(arch, case):
    dtype, g, layout, ue8m0, t, h = case
    on(arch)
    quant_and_check(arch, rows_with_spread(t, h, DTYPES[dtype], device="cpu"), g, layout, ue8m0)


@pytest.mark.parametrize("arch", ARCHS)
def test_emu_quant_grid_paths(arch, monkeypatch):
    """One 16-byte load per lane where the grid fits at once, LOADS where it does not, and the
    grid-stride loop of a capped grid (grid_waves > 0), on a one-CU device."""
    s = on(arch, cus=1)
    x = rows_with_spread(64, 1024, torch.bfloat16, device="cpu")
    first = len(s.launches())
    quant_and_check(arch, x[:4], 128)                           # 32 groups: fits, narrow
    quant_and_check(arch, x, 128, "col")                        # 512 groups: wide
    monkeypatch.setattr(quant_family, "GRID_WAVES", 1)
    quant_and_check(arch, x, 128, "col_tma")                    # capped: grid-stride
    narrow, wide, capped = launched(s, first)
    assert "quant_kernelILi1E" in narrow.kernel and "quant_kernelILi2E" in wide.kernel
    assert capped.grid[0] < wide.grid[0], (wide, capped)


@pytest.mark.parametrize("arch", ARCHS)
def test_emu_quant_boundaries_and_special_values(arch):
    """Quotients on and beside every fp8 rounding midpoint (denormal results included), an
    all-zero group, strided rows, and NaN / inf following the reference."""
    on(arch)
    dtype, fmax = fp8_of(arch)
    for g, dt in ((128, torch.bfloat16), (32, torch.float32)):
        x = boundary_rows(48, g, dt, fmax, dtype == torch.float8_e4m3fnuz, device="cpu")
        quant_and_check(arch, x.repeat(1, 2), g)
    base = rows_with_spread(9, 768 + 256, torch.bfloat16, device="cpu")
    x = base[:, :768]
    x[3, :128] = 0
    q, _ = quant_and_check(arch, x, 128)
    assert (q[3, :128].view(torch.uint8) == 0).all()
    x = rows_with_spread(4, 256, torch.float16, device="cpu")
    x[0, 5], x[1, 200], x[2, 7] = float("nan"), float("inf"), -float("inf")
    q, s = ops.per_token_group_quant_fp8(x, 128)
    rq, rs = reference.group_quant_fp8(x, 128, dtype, fmax)
    assert torch.isnan(s[0, 0]) and torch.isinf(s[1, 1])
    torch.testing.assert_close(s.contiguous(), rs, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(q.float(), rq.float(), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["gfx942"])
def test_emu_rmsnorm_group_quant_vllm_wrong_format_leaves_residual(arch):
    """vLLM's rms_norm_per_block_quant with another FP8 format than the device's (gfx942:
    e4m3fnuz): refused naming quant_dtype before the kernel updates the residual in place."""
    from codegen import vllm
    on(arch)
    x = torch.randn(5, 256).to(torch.bfloat16)
    w, r = torch.ones(256, dtype=torch.bfloat16), torch.randn(5, 256).to(torch.bfloat16)
    before = r.clone()
    with pytest.raises(ValueError, match="quant_dtype: .*float8_e4m3fnuz"):
        vllm.rms_norm_per_block_quant(x, w, 1e-6, torch.float8_e4m3fn, [1, 128], residual=r)
    assert torch.equal(r, before)
    q, _ = vllm.rms_norm_per_block_quant(x, w, 1e-6, torch.float8_e4m3fnuz, [1, 128],
                                         residual=r)
    assert q.dtype == torch.float8_e4m3fnuz and not torch.equal(r, before)


@pytest.mark.parametrize("arch", ARCHS)
def test_emu_quant_into_out(arch):
    """q written into the caller's buffer (poisoned, so an unwritten byte shows), through the
    op and vLLM's out_q; a wrong buffer is refused naming it."""
    from codegen import vllm
    on(arch)
    dtype, fmax = fp8_of(arch)
    x = rows_with_spread(21, 640 + 128, torch.bfloat16, device="cpu")[:, :640]   # strided rows
    out = torch.full((21, 640), 0x7F, dtype=torch.uint8).view(dtype)
    q, s = ops.per_token_group_quant_fp8(x, 64, scale_layout="col_tma", out=out)
    rq, rs = reference.group_quant_fp8(x, 64, dtype, fmax)
    assert q is out
    assert_quant_exact(q, s, rq, rs)
    x3 = x.contiguous().view(3, 7, 640)
    out3 = torch.full((3, 7, 640), 0x7F, dtype=torch.uint8).view(dtype)
    q3, s3 = vllm.per_token_group_quant_fp8(x3, 64, out_q=out3)
    assert q3 is out3 and s3.shape == (3, 7, 10)
    assert_quant_exact(q3.view(21, 640), s3.view(21, 10), rq, rs)
    for bad, match in ((out.view(torch.uint8), "out: .*torch.uint8"),
                       (out[:20], r"out: \(20, 640\)"),
                       (out.t().contiguous().t(), "out: must be contiguous")):
        with pytest.raises(ValueError, match=match):
            ops.per_token_group_quant_fp8(x, 64, out=bad)
    n = out3.numel()
    for bad in (out3.view(torch.uint8), out3.view(7, 3, 640),
                torch.empty(3, 7, 1280, dtype=torch.uint8).view(dtype)[..., :640],
                torch.empty(n + 16, dtype=torch.uint8)[8:8 + n].view(dtype).view(3, 7, 640),
                "q"):
        with pytest.raises((TypeError, ValueError), match="out_q: "):
            vllm.per_token_group_quant_fp8(x3, 64, out_q=bad)
    with pytest.raises(ValueError, match="out: must start on a 16-byte boundary"):
        ops.per_token_group_quant_fp8(x, 64, out=torch.empty(21 * 640 + 16, dtype=torch.uint8)
                                      [8:8 + 21 * 640].view(dtype).view(21, 640))
    # rows off 16-byte boundaries (start 8 bytes in, stride 1288 bytes): an aligned copy first
    xs = rows_with_spread(21, 644, torch.bfloat16, device="cpu")[:, 4:]
    quant_and_check(arch, xs, 64)


def test_emu_quant_gfx942_max_240():
    on("gfx942")
    quant_and_check("gfx942", rows_with_spread(5, 512, torch.bfloat16, device="cpu"), 128,
                    fp8_max=240.0)


# ---- RMSNorm family ----

def row_lengths(arch: str) -> list[int]:
    """One row length inside each tier of the arch's table (16-bit types), the two-pass one
    past the last; odd where the tier allows it."""
    table = tiers("bf16", get_target(arch).wave_size)
    caps = [0] + [t.cap for t in table[:-1]]
    hs = [8 * ((lo + hi) // 2 + 1) for lo, hi in zip(caps, caps[1:])]
    hs.append(8 * caps[-1] + 1024)                      # past the last one-pass tier
    assert [tier_for(h, "bf16", get_target(arch).wave_size) for h in hs] == list(table)
    return hs


def weight(h, dtype):
    return (1 + 0.5 * torch.randn(h)).to(dtype)


def data(t, h, dtype):
    x = rows_with_spread(t, h, torch.float32, device="cpu")
    return (x.clamp(-3e4, 3e4) if dtype == torch.float16 else x).to(dtype)


@pytest.mark.parametrize("arch", NORM_ARCHS)
def test_emu_rmsnorm_tiers(arch):
    """Every row tier, bf16: bit-exact against the fp32 kernel (the same sum order) and within
    1 ulp of the reference; fused_add_rmsnorm on every other tier."""
    on(arch)
    for i, h in enumerate(row_lengths(arch)):
        x, w = data(3, h, torch.bfloat16), weight(h, torch.bfloat16)
        y = ops.rmsnorm(x, w, EPS)
        check_ulps("emu_rmsnorm", y, reference.rmsnorm(x, w, EPS))
        assert_same(y, ops.rmsnorm(x.float(), w.float(), EPS).to(x.dtype), f"H={h} vs fp32")
        if i % 2 == 0:
            res = data(3, h, torch.bfloat16)
            r0 = res.clone()
            y2 = ops.fused_add_rmsnorm(x, res, w, EPS)
            assert_same(res, reference.residual_add(x, r0), f"H={h} residual in place")
            assert_same(y2, ops.rmsnorm(res, w, EPS), f"H={h} fused_add vs add then rmsnorm")


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("arch", NORM_ARCHS)
def test_emu_rmsnorm_dtypes_and_scalar_path(arch, dtype):
    """Each dtype on 16-byte rows and on the scalar path (rows not 16-byte aligned, odd H),
    strided rows, fp32 past its one-pass tiers."""
    on(arch)
    dt = DTYPES[dtype]
    for t, h in ((7, 1536), (2, 101), (5, 1000)):
        x, w = data(t, h, dt), weight(h, dt)
        y = ops.rmsnorm(x, w, EPS)
        check_ulps(f"emu_rmsnorm_{h}", y, reference.rmsnorm(x, w, EPS))
    base = data(4, 1024 + 24, dt)
    x, w = base[:, 3:3 + 1000], weight(1000, dt)            # strided and misaligned rows
    assert_same(ops.rmsnorm(x, w, EPS), ops.rmsnorm(x.contiguous(), w, EPS), "strided")
    if dt == torch.float32:
        h = tiers("fp32", get_target(arch).wave_size)[-2].cap * 8 + 512
        x, w = data(2, h, dt), weight(h, dt)
        check_ulps("emu_rmsnorm_two_pass", ops.rmsnorm(x, w, EPS), reference.rmsnorm(x, w, EPS))


@pytest.mark.parametrize("arch", ["gfx942", "gfx1201"])
def test_emu_rmsnorm_fp32_rows_of_one_value(arch):
    """fp32 rows of one repeated value are where the per-thread sums drift most from the
    reference's: the 8-ulp contract holds up to H = 65536 (docs/numerics.md)."""
    on(arch)
    h = 1 << 16
    for value in (0.1, 1.1, 3.3, 9.1):
        x, w = torch.full((1, h), value), torch.ones(h)
        check_ulps("emu_rmsnorm_one_value", ops.rmsnorm(x, w, EPS), reference.rmsnorm(x, w, EPS))


@pytest.mark.parametrize("arch", NORM_ARCHS)
def test_emu_rmsnorm_residual_out(arch):
    """The sum written to a residual_out apart from the residual: the in-place form's bits, the
    inputs kept, nothing written beside its rows; one-pass, split and two-pass rows, and the
    scalar path; bf16, and fp16 / fp32 on their own row tiers (the fused quant where built)."""
    on(arch)
    check_residual_out("cpu", (256, 1536, 3072, 17408), 3, quant=arch in ARCHS)
    check_residual_out("cpu", (512, 16384 + 512), 2, (torch.float16, torch.float32),
                       quant=arch in ARCHS)


@pytest.mark.parametrize("arch", NORM_ARCHS)
def test_emu_rmsnorm_keeps_the_sign_of_zero(arch):
    """y = dtype(x * rstd * w) of x = -0 is -0 in every dtype and path (the backend once folded
    the fp16 multiply into an fma with a +0 addend)."""
    on(arch)
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        base, w = data(3, 1024 + 8, dt), weight(1024, dt).abs()
        base[:, ::3] = -0.0
        for x in (base[:, :1024], base[:, 3:1027]):          # 16-byte rows, then scalar path
            zero = x == 0
            y = ops.rmsnorm(x, w, EPS)
            assert_same(y[zero], x[zero], f"{dt}: signs of zero")


def test_emu_rmsnorm_gfx90a_code_decodes_as_cdna3():
    """gfx90a's RMSNorm code objects run on the emulator's CDNA model (CDNA3 / CDNA4 encodings):
    every instruction in them disassembles the same for gfx942 as for gfx90a."""
    import shutil
    import subprocess

    from codegen.build.jit import compile_variant
    from codegen.spec import enumerate_variants

    objdump = shutil.which("llvm-objdump-22") or shutil.which("llvm-objdump")
    if objdump is None:
        pytest.skip("no llvm-objdump")
    for v in enumerate_variants("rmsnorm", get_target("gfx90a")):
        co = compile_variant(v, emu=True) / f"{v.uri}.co"

        def text(cpu):
            out = subprocess.run([objdump, "-d", f"--mcpu={cpu}", str(co)], check=True,
                                 capture_output=True, text=True).stdout
            return [line.split("//")[0].strip() for line in out.splitlines()
                    if line.startswith("\t")]
        gfx90a = text("gfx90a")
        assert gfx90a and gfx90a == text("gfx942"), v.uri


RGQ = [("bf16", 128, "row", False, False, 5, 1536), ("bf16", 128, "col_tma", False, True, 3, 4096),
       ("fp16", 64, "col", True, False, 6, 2048), ("bf16", 64, "row", True, True, 2, 7168),
       ("fp16", 128, "col_tma", False, False, 1, 512), ("bf16", 32, "col", False, True, 4, 2080)]


def rgq_id(c) -> str:
    return f"{c[0]}-g{c[1]}-{c[2]}{'-ue8m0' if c[3] else ''}{'-residual' if c[4] else ''}-h{c[6]}"


@pytest.mark.parametrize("case", RGQ, ids=rgq_id)
@pytest.mark.parametrize("arch", ARCHS)
def test_emu_rmsnorm_group_quant(arch, case):
    """Fused against the unfused kernels composed (bit-exact), and the reference."""
    dtype, g, layout, ue8m0, with_residual, t, h = case
    on(arch)
    fp8_dtype, fmax = fp8_of(arch)
    dt = DTYPES[dtype]
    x, w = data(t, h, dt), weight(h, dt)
    residual = data(t, h, dt) if with_residual else None
    r0 = residual.clone() if with_residual else None
    out = ops.rmsnorm_group_quant(x, w, EPS, g, residual=residual, scale_layout=layout,
                                  ue8m0=ue8m0, also_return_unquantized=True)
    check_fused_quant("emu_rmsnorm_group_quant_y", out, x, w, EPS, g, layout, ue8m0, residual,
                      r0, fp8_dtype, fmax)


@pytest.mark.parametrize("arch", ARCHS)
def test_emu_rmsnorm_group_quant_split_rows(arch):
    """Rows of 2049-4096 elements without a residual: the 256 x 2 kernel where the grid fits on
    the device at once (one CU), 128 threads x 4 chunks summing as it does where it does not;
    both bit for bit the unfused kernels composed, and the dual kernel's q."""
    s = on(arch, cus=1)
    fp8_dtype, fmax = fp8_of(arch)
    first = len(s.launches())
    for t in (2, 40):
        x, w = data(t, 3072, torch.bfloat16), weight(3072, torch.bfloat16)
        out = ops.rmsnorm_group_quant(x, w, EPS, 128, also_return_unquantized=True)
        check_fused_quant("emu_rmsnorm_group_quant_y", out, x, w, EPS, 128, "row", False, None,
                          None, fp8_dtype, fmax)
    fused = [k.kernel for k in launched(s, first) if "rmsnorm_quant_kernel" in k.kernel]
    assert len(fused) == 2 and "ILi256ELi2ELb0ELi256ELi1E" in fused[0], fused
    assert "ILi128ELi4ELb0ELi128ELi2E" in fused[1], fused
    # the dual kernel's q rows, in the 256 x 2 layout, match the split rows' bytes
    kv, kvw = data(40, 512, torch.bfloat16), weight(512, torch.bfloat16)
    q8, qs, _ = ops.dual_rmsnorm_group_quant(x, w, kv, kvw, EPS, 128)
    assert_same(q8, out[0], "dual q vs split rows")
    assert_same(qs, out[1], "dual scales vs split rows")


@pytest.mark.parametrize("arch", ["gfx942", "gfx1201"])
def test_emu_rmsnorm_group_quant_g32_every_row_tier(arch):
    """G = 32 (4 lanes a group) through each row tier of a wave64 and a wave32 target (sm_90a's
    warp is gfx1201's wave): from 16 threads a row to the two-pass 1024-thread rows."""
    s = on(arch)
    fp8_dtype, fmax = fp8_of(arch)
    first = len(s.launches())
    for i, h in enumerate((32, 800, 1568, 3104, 6176, 12320, 16416)):
        x, w = data(2, h, torch.bfloat16), weight(h, torch.bfloat16)
        residual = data(2, h, torch.bfloat16) if i % 2 else None
        r0 = residual.clone() if residual is not None else None
        out = ops.rmsnorm_group_quant(x, w, EPS, 32, residual=residual, scale_layout="col",
                                      also_return_unquantized=True)
        check_fused_quant("emu_rmsnorm_group_quant_y", out, x, w, EPS, 32, "col", False,
                          residual, r0, fp8_dtype, fmax)
    tiers = {k.kernel.split("rmsnorm_quant_kernel")[1][:24] for k in launched(s, first)
             if "rmsnorm_quant_kernel" in k.kernel}
    # wave32: 16 x 2, 32 x 4, 128 x 2, 256 x 2 (the split tier's grid fits at once), 256 x 4,
    # 1024 x 2, two-pass; wave64 holds 800 and 1568 both in 64 x 4
    assert len(tiers) == (7 if arch == "gfx1201" else 6), tiers


@pytest.mark.parametrize("g", [32, 128])
@pytest.mark.parametrize("arch", ARCHS)
def test_emu_dual_rmsnorm_group_quant(arch, g):
    on(arch)
    t = 3
    q, qw = data(t, 1536, torch.bfloat16), weight(1536, torch.bfloat16)
    kv, kvw = data(t, 512, torch.bfloat16), weight(512, torch.bfloat16)
    q8, qs, kvn = ops.dual_rmsnorm_group_quant(q, qw, kv, kvw, EPS, g, scale_layout="col_tma")
    sq, ss = ops.rmsnorm_group_quant(q, qw, EPS, g, scale_layout="col_tma")
    assert_same(q8, sq, "dual q vs rmsnorm_group_quant")
    assert_same(qs, ss, "dual scales vs rmsnorm_group_quant")
    assert_same(kvn, ops.rmsnorm(kv, kvw, EPS), "dual kv vs rmsnorm")


# ---- FP8 block-scale GEMM ----

def gemm_inputs(arch, m, n, k):
    dtype, fmax = fp8_of(arch)
    a, sa = quant_blocks(rows_with_spread(m, k, torch.float32, device="cpu"), 1, dtype, fmax)
    b, sb = quant_blocks(torch.randn(n, k) * 0.05, 128, dtype, fmax)
    return a, sa, b, sb




def gemm_configs(arch):
    """The configs a build for arch compiles (the dispatch heuristic's and a tuned table's,
    once there is one), plus a swapped mma tile (wider in N), an mma tile without split-K, one
    split 14 ways (a count that is not a power of two), a second lds tile and the decode kernel
    on 4 rows of A (on CDNA its FP8 sources reach v128 and up), where valid."""
    extra = [gemm_family.config("mma", 16, 32, split_k=2), gemm_family.config("mma", 32, 16),
             gemm_family.config("mma", 16, 16, split_k=14),
             gemm_family.config("lds", 64, 64, stages=2),
             gemm_family.config("gemv", 4, 1, split_k=2)]
    out = list(gemm_family.default_configs(arch))
    for c in [*gemm_family.table(arch).values(), *extra]:
        v = make_variant(gemm_family.FAMILY, arch, **c,
                         fp8=get_target(arch).fp8_format().token)
        if validate(v) is None and c not in out:
            out.append(c)
    return out


def config_id(c) -> str:
    extra = "".join(f"-{c[key]}" for key in ("atom", "wave_tile") if c.get(key))
    return f"{c['kernel']}{c['block_m']}x{c['block_n']}-sk{c['split_k']}{extra}"


def check_config_on_tail(arch, c) -> None:
    """Config c on a tail in M, N and K, with column-major (TMA-padded) activation scales."""
    from codegen.ops.gemm import gemm_with_config

    m, n, k = (c["block_m"] + 3, c["block_n"] * 2 + 8, 128 * 2 + 16)
    a, sa, b, sb = gemm_inputs(arch, m, n, k)
    sa_col = torch.empty(sa.shape[1], -(-m // 4) * 4)[:, :m].t()
    sa_col.copy_(sa)
    check_gemm(gemm_with_config(a, sa_col, b, sb, c), a, sa, b, sb)


@pytest.mark.parametrize("arch", ARCHS)
def test_emu_gemm_dispatch(arch):
    """Through dispatch: the decode, small-M and large-M kernels, tails in M, N and K; on CDNA
    the large-M tile by the emulated device's CU count (4): 64 x 64 where 128 x 128 tiles would
    leave CUs idle (2 tiles at 83 x 136), 128 x 128 where they fill them (10 at 200 x 520)."""
    s = on(arch)
    kinds, tiles = set(), []
    for m, n, k in ((1, 200, 400), (3, 136, 272), (7, 200, 400), (83, 136, 272),
                    (200, 520, 272)):
        first = len(s.launches())
        a, sa, b, sb = gemm_inputs(arch, m, n, k)
        check_gemm(ops.gemm_a8w8_blockscale(a, sa, b, sb), a, sa, b, sb)
        kinds |= {next(kind for kind in ("lds", "gemv", "mma") if f"_{kind}_" in x.uri)
                  for x in launched(s, first)}
        tiles += [x.uri.split("_lds_")[1].split("_k128")[0] for x in launched(s, first)
                  if "_lds_" in x.uri]
    assert kinds == {"gemv", "mma", "lds"}, kinds
    cdna = get_target(arch).wave_size == 64
    assert tiles == (["m64_n64", "m128_n128"] if cdna else ["m128_n64", "m128_n64"]), tiles


@pytest.mark.parametrize("arch", ARCHS)
def test_emu_gemm_k_not_a_multiple_of_16(arch):
    """K = 300 and 100 through the decode, small-M and large-M kernels, read as zero-padded rows;
    and an empty N."""
    s = on(arch)
    first = len(s.launches())
    for m, n, k in ((1, 200, 300), (7, 136, 300), (200, 520, 300), (7, 72, 100)):
        check_gemm_unaligned_k(*gemm_inputs(arch, m, n, k))
    assert {kind for x in launched(s, first) for kind in ("lds", "gemv", "mma")
            if f"_{kind}_" in x.uri} == {"gemv", "mma", "lds"}
    a, sa, b, sb = gemm_inputs(arch, 4, 128, 256)
    assert ops.gemm_a8w8_blockscale(a, sa, b[:0], sb[:0]).shape == (4, 0)


@pytest.mark.parametrize("arch", ARCHS)
def test_emu_gemm_lds_k_paths(arch):
    """The lds kernel's K loop runs whole K blocks without the K test and peels the last whole
    block and a tail: K below one block, K of whole blocks only, and whole blocks and a tail."""
    from codegen.ops.gemm import gemm_with_config

    on(arch)
    c = gemm_family.config("lds", 64, 64, stages=2)
    for k in (112, 256, 400):
        a, sa, b, sb = gemm_inputs(arch, 67, 72, k)
        check_gemm(gemm_with_config(a, sa, b, sb, c), a, sa, b, sb)


@pytest.mark.parametrize("arch", ARCHS)
def test_emu_gemm_configs(arch):
    """Every config the build compiles and the swap / split-K forms, on tails in M, N and K,
    with column-major (TMA-padded) activation scales."""
    on(arch)
    for c in gemm_configs(arch):
        check_config_on_tail(arch, c)


@pytest.mark.emu_sweep
@pytest.mark.parametrize("arch", ARCHS)
def test_emu_gemm_tuner_candidates(arch):
    """Every config `python -m codegen.tune` may time on arch (those that do not spill), once on
    a tail in M, N and K with column-major (TMA-padded) activation scales (make
    test-emu-sweep: about 350 configs)."""
    on(arch)
    from codegen import tune

    failed = []
    for c in tune.without_spills(arch, tune.candidates(arch)):
        try:
            check_config_on_tail(arch, c)
        except Exception as e:     # a wrong result, or the emulator stopping
            failed.append(f"{config_id(c)}-s{c['stages']}: {type(e).__name__}: {e}")
    assert not failed, failed


@pytest.mark.parametrize("arch", ARCHS)
def test_emu_gemm_takes_rmsnorm_quant_scales(arch):
    """rmsnorm_group_quant's col_tma scales consumed by the GEMM as they are."""
    on(arch)
    dtype, fmax = fp8_of(arch)
    x, w = data(5, 384, torch.bfloat16), weight(384, torch.bfloat16)
    q, s = ops.rmsnorm_group_quant(x, w, EPS, 128, scale_layout="col_tma")
    b, sb = quant_blocks(torch.randn(160, 384) * 0.05, 128, dtype, fmax)
    check_gemm(ops.gemm_a8w8_blockscale(q, s, b, sb), q, s.contiguous(), b, sb)


# ---- codegen.nn: the modules an engine drops in, over the same kernels ----

@pytest.mark.parametrize("arch", ARCHS)
def test_emu_modules(arch, monkeypatch):
    """BlockFP8Linear is its two ops plus the bias, near bf16 math; an e4m3fn checkpoint pair
    (DeepSeek-V3's format) gives what it means, by from_fp8 and by load_state_dict alike (on
    gfx942 converted to e4m3fnuz, the scales doubled); RMSNorm(quantize=True) hands the linear
    its FP8 activation."""
    from torch import nn

    from codegen import nn as cnn
    on(arch)
    fmt = get_target(arch).fp8_format()
    fp8 = getattr(torch, fmt.torch_dtype)
    # the module asks the GPU's arch of torch.cuda: here the emulated device's
    monkeypatch.setattr(cnn, "device_fp8", lambda device: (fp8, fmt.max))
    torch.manual_seed(0)
    k, n, bf = 512, 384, torch.bfloat16
    lin = nn.Linear(k, n).to(bf)
    x = (torch.randn(2, 3, k) * 2).to(bf)

    layer = cnn.BlockFP8Linear.from_linear(lin)
    assert layer.weight.dtype == fp8
    y = layer(x)
    assert y.shape == (2, 3, n) and y.dtype == bf
    q, s = ops.per_token_group_quant_fp8(x.view(-1, k), 128)
    by_hand = ops.gemm_a8w8_blockscale(q, s, layer.weight, layer.weight_scale_inv) + lin.bias
    assert_same(y.view(-1, n), by_hand, "BlockFP8Linear vs its ops")
    assert rel_err(y, lin(x)) < 0.05

    wq, ws = cnn.quantize_weight(lin.weight.float(), torch.float8_e4m3fn, 448.0)
    pair = cnn.BlockFP8Linear.from_fp8(wq, ws, out_dtype=bf)
    assert pair.weight.dtype == fp8
    assert torch.equal(pair.weight_scale_inv, ws * (2 if fp8 == torch.float8_e4m3fnuz else 1))
    deq = wq.float() * ws.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    assert rel_err(pair(x), x.float() @ deq.t()) < 0.03
    loaded = cnn.BlockFP8Linear(k, n, bias=False, device="cpu", out_dtype=bf)
    loaded.load_state_dict({"weight": wq, "weight_scale_inv": ws})
    assert_same(loaded(x), pair(x), "load_state_dict vs from_fp8")

    norm = cnn.RMSNorm(k, quantize=True, device="cpu")
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k) + 0.5)
    act = norm(x)
    assert isinstance(act, cnn.FP8Activation) and act.q.shape == x.shape
    q, s = ops.rmsnorm_group_quant(x.view(-1, k), norm.weight, EPS, 128)
    by_hand = ops.gemm_a8w8_blockscale(q, s, layer.weight, layer.weight_scale_inv) + lin.bias
    assert_same(layer(act).view(-1, n), by_hand, "linear(FP8Activation)")


# ---- codegen.vllm: vLLM's names and conventions over the same kernels ----

@pytest.mark.parametrize("arch", ARCHS)
def test_emu_vllm_entry_points(arch):
    """Quant, the norms, norm + quant and the GEMM under vLLM's names and layouts, each bit for
    bit the ops it is made of (gfx942: its e4m3fnuz format)."""
    on(arch)
    check_vllm_entry_points("cpu")


# ---- codegen.aiter: AITER's names and conventions over the same kernels ----

@pytest.mark.parametrize("arch", ARCHS)
def test_emu_aiter_entry_points(arch):
    """Quant (FP8 max 240 on gfx942, as AITER's finfo), norms, fused norm + quant in one launch
    and in two, and the GEMM, each bit for bit the ops it is made of."""
    s = on(arch)
    check_aiter_entry_points("cpu")
    # the residual written apart by the norm's own launch: no copy or clone of it first
    from torch.utils._python_dispatch import TorchDispatchMode

    from codegen import aiter

    class TorchOps(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x, res, w = data(5, 512, torch.bfloat16), data(5, 512, torch.bfloat16), weight(512,
                                                                                   torch.bfloat16)
    first = len(s.launches())
    with TorchOps():
        aiter.rmsnorm2d_fwd_with_add(torch.empty_like(x), x, res, torch.empty_like(res), w, EPS)
        aiter.fused_rms_fp8_group_quant(x, w, EPS, res1=res)
    assert not {"copy_", "clone", "_to_copy"} & set(TorchOps.seen), TorchOps.seen
    names = [k.kernel for k in launched(s, first)]
    assert len(names) == 2 and "rmsnorm_kernel" in names[0] and "rmsnorm_quant_kernel" in names[1], \
        names


# ---- the emulator's gaps (codegen.emu.gaps): each fix, and what goes wrong without it ----

def evaluate(fn, bits: list[int]) -> list[int]:
    """fn over uint32 inputs, run by tinygrad on the CPU (as the emulator runs an instruction)."""
    emu.emulator()
    from tinygrad import Tensor, dtypes

    return Tensor(fn(Tensor(bits, dtype=dtypes.uint32).uop)).numpy().tolist()


def test_emu_buffers_sit_between_guard_pages():
    """Every buffer the emulator allocates has no-access memory right after it (within 16
    bytes) and 64 KiB before the page it starts in, so that a read outside one faults on every
    run."""
    emu.emulator()
    from tinygrad import dtypes
    from tinygrad.device import Buffer

    def access(addr):       # the permissions of the mapping that holds addr
        for line in open("/proc/self/maps"):
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= addr < hi:
                return perms[:3]
        return None

    for size in (4, 512, 100 * 4, 256 * 64 * 4):
        buf = Buffer("CPU", size // 4, dtypes.uint32).ensure_allocated()
        va = buf._buf.va_addr
        assert access(va) == "rw-" and access(va + size - 1) == "rw-", size
        assert access(va + size + 15) in ("---", None), size
        page = va & ~4095
        assert access(page - 1) == "---" and access(page - (64 << 10)) == "---", size


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
def test_emu_gap_fp8_convert(fmt):
    """V_CVT_PK_FP8_F32 as the ISA states it (RNE, denormal results kept; FNUZ on gfx942)
    equals torch's conversion on 100k values; the emulator's own flushes denormal results
    (and knows only OCP)."""
    from codegen.emu import gaps

    dtype, bias, mx = {"e4m3fn": (torch.float8_e4m3fn, 7, 448.0),
                       "e4m3fnuz": (torch.float8_e4m3fnuz, 8, 240.0)}[fmt]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(100000, generator=g) * torch.exp2(
        torch.randint(-14, 10, (100000,), generator=g).float())
    x = torch.cat([x, torch.tensor([0.0, -0.0, 2.0 ** (-bias - 2), -3 * 2.0 ** (-bias - 4)])])
    x = x.clamp(-mx, mx)
    bits = x.view(torch.int32).numpy().astype("uint32").tolist()
    want = x.to(dtype).view(torch.uint8).tolist()
    ours = evaluate(lambda u: gaps.f32_to_e4m3(u, bias, fmt == "e4m3fnuz"), bits)
    assert ours == want
    theirs = evaluate(gaps._ORIGINAL_FUNCS["f32_to_fp8"], bits)
    denormal = {i for i, b in enumerate(want) if b & 0x78 == 0 and b & 0x07}   # denormal results
    assert denormal and all(theirs[i] & 0x7F == 0 for i in denormal)           # flushed
    if fmt == "e4m3fnuz":   # and the decode the MFMA inputs go through
        decoded = evaluate(lambda u: gaps.e4m3fnuz_to_f32(u).bitcast(u.dtype), list(range(256)))
        want = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fnuz).float()
        got = torch.tensor(decoded, dtype=torch.int64).to(torch.int32).view(torch.float32)
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))


def test_emu_gap_fnuz_gemm_inputs_gfx942():
    """gfx942's MFMA reads FNUZ bytes (bias 8): read as OCP, every product is off by 2x."""
    from codegen.emu import gaps

    on("gfx942")
    a, sa, b, sb = gemm_inputs("gfx942", 7, 136, 256)
    check_gemm(ops.gemm_a8w8_blockscale(a, sa, b, sb), a, sa, b, sb)
    with gaps.disabled("fp8_fnuz"):
        out = ops.gemm_a8w8_blockscale(a, sa, b, sb)
    assert rel_err(out, reference.gemm_a8w8_blockscale(a, sa, b, sb)) > 0.5


def test_emu_gap_wmma_fp8_and_global_inv_gfx1201():
    """gfx1201's V_WMMA_F32_16X16X16_FP8_FP8 takes FP8 inputs (the emulator read them as f16),
    and its GLOBAL_INV is a cache operation (the emulator has no entry for it)."""
    from codegen.emu import gaps

    on("gfx1201")
    a, sa, b, sb = gemm_inputs("gfx1201", 7, 136, 256)
    with gaps.disabled("global_inv"):
        with pytest.raises(RuntimeError, match="GLOBAL_INV"):
            ops.gemm_a8w8_blockscale(a, sa, b, sb)
    with gaps.disabled("wmma_fp8"):
        out = ops.gemm_a8w8_blockscale(a, sa, b, sb)
    assert rel_err(out, reference.gemm_a8w8_blockscale(a, sa, b, sb)) > 0.5


@pytest.mark.parametrize("arch", ["gfx942", "gfx1201"])
def test_emu_gap_dpp_in_place(arch):
    """A DPP instruction whose destination is its source (v_add_f32_dpp v1, v1, v1
    quad_perm:[2,3,0,1]: the row sums' butterfly) reads every lane before it writes; the
    emulator wrote lane by lane, so later lanes added their partners' new sums."""
    from codegen.emu import gaps

    on(arch)
    x, w = data(3, 64, torch.float32), weight(64, torch.float32)
    ref = reference.rmsnorm(x, w, EPS)
    with gaps.disabled("dpp_in_place"):
        assert rel_err(ops.rmsnorm(x, w, EPS), ref) > 0.01
    check_ulps("emu_rmsnorm", ops.rmsnorm(x, w, EPS), ref)


@pytest.mark.parametrize("arch", ["gfx1201", "gfx1100"])
def test_emu_gap_permlane16_select(arch):
    """v_permlanex16_b32 (the row sums' step 16 on wave32) takes its lane selects from S1 and S2,
    here 0xfedcba98 as a literal; the emulator's own compile dropped the literal."""
    from codegen.emu import gaps

    on(arch)
    # each lane's part of the row sum distinct (the wrong lanes' parts are then far off)
    x = (torch.arange(4096).float() // 8 % 61 + 1).repeat(3, 1).to(torch.bfloat16)
    w = weight(4096, torch.bfloat16)
    ref = reference.rmsnorm(x, w, EPS)
    with gaps.disabled("permlane16_select"):
        assert ulps(ops.rmsnorm(x, w, EPS), ref) > 4      # the contract is 1
    check_ulps("emu_rmsnorm", ops.rmsnorm(x, w, EPS), ref)


def test_emu_gap_permlane_swap_gfx950():
    """v_permlane16_swap / v_permlane32_swap (gfx950's butterfly steps 16 and 32) write two
    registers across lanes; the emulator's pseudocode compiler stopped on them."""
    from codegen.emu import gaps

    on("gfx950")
    x = (torch.arange(4096).float() // 8 % 61 + 1).repeat(3, 1).to(torch.bfloat16)
    w = weight(4096, torch.bfloat16)
    with gaps.disabled("permlane_swap"), pytest.raises(RuntimeError, match="permlane32_swap"):
        ops.rmsnorm(x, w, EPS)
    check_ulps("emu_rmsnorm", ops.rmsnorm(x, w, EPS), reference.rmsnorm(x, w, EPS))


def test_emu_gap_buffer_gl0_inv_gfx1100():
    """gfx1100's BUFFER_GL0_INV (the cache invalidation of a workgroup-scope acquire after a
    barrier) is a cache operation; the emulator's RDNA3 decoder has no MUBUF format for it."""
    from codegen.emu import gaps

    on("gfx1100")
    x, w = data(3, 4096, torch.bfloat16), weight(4096, torch.bfloat16)
    with gaps.disabled("global_inv"):
        with pytest.raises(ValueError, match="unknown rdna3 format word=0xe0ac0000"):
            ops.rmsnorm(x, w, EPS)
    check_ulps("emu_rmsnorm", ops.rmsnorm(x, w, EPS), reference.rmsnorm(x, w, EPS))


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_emu_gap_fp8_unpack(arch):
    """v_cvt_pk_f32_fp8 (the CDNA decode GEMM's FP8 -> f32) writes two f32 registers: the
    emulator's CDNA model stopped on the two-part destination (its RDNA4 model did not know the
    operand either; gfx12's decode GEMM dots FP8 bytes instead, test_emu_gemm_gemv_fp8_dot4_gfx1201)."""
    from codegen.emu import gaps
    from codegen.ops.gemm import gemm_with_config

    on(arch)
    c = gemm_family.config("gemv", 1, 2, split_k=2)
    a, sa, b, sb = gemm_inputs(arch, 1, 40, 256)
    check_gemm(gemm_with_config(a, sa, b, sb, c), a, sa, b, sb)
    with gaps.disabled("fp8_unpack"):
        with pytest.raises(RuntimeError, match="(?i)v_cvt_pk_f32_fp8"):
            gemm_with_config(a, sa, b, sb, c)


@pytest.mark.parametrize("block_m", [1, 2, 4])
def test_emu_gemm_gemv_fp8_dot4_gfx1201(block_m):
    """gfx12's decode GEMM sums each 16-byte piece with v_dot4_f32_fp8_fp8 (the ISA's adds in
    byte order) for 1, 2 and 4 rows of A per block, M a tail of the block's rows (grid y)."""
    from codegen.ops.gemm import gemm_with_config

    session = on("gfx1201")
    start = len(session.launches())
    c = gemm_family.config("gemv", block_m, 2, split_k=2)
    a, sa, b, sb = gemm_inputs("gfx1201", 2 * block_m + 1, 40, 400)
    check_gemm(gemm_with_config(a, sa, b, sb, c), a, sa, b, sb)
    assert any("_gemv_m" in x.uri for x in launched(session, start))


def test_emu_gap_fp8_dot4_gfx1201():
    """v_dot4_f32_fp8_fp8 (gfx12's decode GEMM) takes its bytes as FP8 values; the emulator's
    pseudocode took them as integers."""
    from codegen.emu import gaps
    from codegen.ops.gemm import gemm_with_config

    on("gfx1201")
    c = gemm_family.config("gemv", 1, 2, split_k=2)
    a, sa, b, sb = gemm_inputs("gfx1201", 1, 40, 256)
    check_gemm(gemm_with_config(a, sa, b, sb, c), a, sa, b, sb)
    with gaps.disabled("fp8_dot4"):
        out = gemm_with_config(a, sa, b, sb, c)
    assert rel_err(out, reference.gemm_a8w8_blockscale(a, sa, b, sb)) > 0.5


@pytest.mark.parametrize("arch", ["gfx942", "gfx1201"])
def test_emu_gap_div_scale(arch):
    """V_DIV_SCALE_F32 as the ISA states it: the IEEE division of a tiny mean of squares (rows
    near 2^-56, H not a power of two, eps 0) gives the reference's 1.0; the emulator's own
    version of the instruction made it inf."""
    from codegen.emu import gaps

    on(arch)
    for h, e in ((33, -112), (1000, -118), (1536, -120)):
        x, w = torch.full((2, h), 2.0 ** (e / 2)), torch.ones(h)
        want = reference.rmsnorm(x, w, 0.0)
        assert (want == 1).all()
        assert_same(ops.rmsnorm(x, w, 0.0), want, f"H={h}")
        with gaps.disabled("div_scale"):
            assert torch.isinf(ops.rmsnorm(x, w, 0.0)).all()


def test_emu_gap_float_denorm_gfx950():
    """The kernels keep f32 denormals (FLOAT_DENORM_MODE_32 = 3); the emulator ran every
    instruction with x86 DAZ + FTZ, i.e. flushed them: denormal weights gave zeros."""
    from codegen.emu import gaps

    on("gfx950")
    x, w = torch.randn(2, 256), torch.randn(256) * 1e-39
    want = reference.rmsnorm(x, w, EPS)
    check_ulps("emu_rmsnorm_denormal_weights", ops.rmsnorm(x, w, EPS), want)
    with gaps.disabled("float_denorm"):
        flushed = ops.rmsnorm(x, w, EPS)
    assert (flushed == 0).all() and (want != 0).all()


# the split-K sum of a tail tile, run once with the fix switched off, in a process of its own
_LDS_UNFIXED = """
from codegen.emu import gaps
from codegen.families import gemm as gemm_family
from codegen.ops.gemm import gemm_with_config
from tests.test_emu import gemm_inputs, on
on("gfx1201")
a, sa, b, sb = gemm_inputs("gfx1201", 19, 40, 272)
with gaps.disabled("lds_inactive_lanes"):
    gemm_with_config(a, sa, b, sb, gemm_family.config("mma", 16, 16, split_k=4))
"""


def test_emu_gap_lds_inactive_lanes_gfx1201():
    """LDS instructions leave out the lanes EXEC masks; the emulator read LDS at those lanes'
    stale addresses too. The split-K sum of a tile past the matrix edge (the loads sunk into the
    store's bounds check) took it outside its LDS buffer: the process crashed (SIGSEGV)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from codegen.ops.gemm import gemm_with_config

    on("gfx1201")
    a, sa, b, sb = gemm_inputs("gfx1201", 19, 40, 272)
    check_gemm(gemm_with_config(a, sa, b, sb, gemm_family.config("mma", 16, 16, split_k=4)),
               a, sa, b, sb)
    unfixed = subprocess.run([sys.executable, "-c", _LDS_UNFIXED], capture_output=True, text=True,
                             cwd=Path(__file__).parent.parent)
    assert unfixed.returncode == -signal.SIGSEGV, unfixed.stderr[-2000:]


def assert_rows_misplaced(out, a, sa, b, sb):
    """Most output rows wrong, as when accumulators land in another row's place. The rows'
    spread of magnitudes makes the mean error of the whole output a poor witness (a few large
    rows may stay in place)."""
    ref = reference.gemm_a8w8_blockscale(a, sa, b, sb).float()
    row_err = (out.float() - ref).abs().mean(1) / ref.abs().mean(1)
    assert (row_err > 1e-2).float().mean() > 0.5, row_err


@pytest.mark.parametrize("arch,atom", [("gfx942", "32x32x16"), ("gfx950", "32x32x64")])
def test_emu_gap_mfma_32x32_accumulators(arch, atom):
    """v_mfma_f32_32x32x16_fp8_fp8 (gfx942) and v_mfma_f32_32x32x64_f8f6f4 (gfx950) keep D row
    8 (r / 4) + 4 (lane / 32) + r % 4 in register r (the Matrix Instruction Calculator); the
    emulator placed row 16 (lane / 32) + r there."""
    from codegen.emu import gaps
    from codegen.ops.gemm import gemm_with_config

    on(arch)
    c = gemm_family.config("lds", 64, 64, stages=2, atom=atom)
    a, sa, b, sb = gemm_inputs(arch, 67, 136, 256)
    check_gemm(gemm_with_config(a, sa, b, sb, c), a, sa, b, sb)
    with gaps.disabled("mfma_32x32_out"):
        assert_rows_misplaced(gemm_with_config(a, sa, b, sb, c), a, sa, b, sb)


def check_gap_shown(arch, c, shape, gap):
    """Config c right on an M x N x K shape with every fix, wrong (or NaN) with `gap` off."""
    from codegen.emu import gaps
    from codegen.ops.gemm import gemm_with_config

    on(arch)
    a, sa, b, sb = gemm_inputs(arch, *shape)
    check_gemm(gemm_with_config(a, sa, b, sb, c), a, sa, b, sb)
    with gaps.disabled(gap):
        out = gemm_with_config(a, sa, b, sb, c)
    assert not rel_err(out, reference.gemm_a8w8_blockscale(a, sa, b, sb)) < 0.5   # NaN: wrong


@pytest.mark.parametrize("arch,c,shape", [
    ("gfx950", gemm_family.config("lds", 64, 64, stages=2, atom="32x32x64",
                                  wave_tile="w64x32"), (67, 72, 272)),
    ("gfx942", gemm_family.config("mma", 64, 64), (67, 136, 272))],
    ids=["gfx950-32x32x64", "gfx942-16x16x32"])
def test_emu_gap_mfma_acc_ab(arch, c, shape):
    """Tiles over 256 registers make the compiler feed MFMA operands from AGPRs (their ACC
    bits): the 64 x 32 lds wave tile on v_mfma_f32_32x32x64_f8f6f4 (264 registers), a 64 x 64
    mma tile on v_mfma_f32_16x16x32_fp8_fp8 (280); the emulator read VGPRs there."""
    check_gap_shown(arch, c, shape, "mfma_acc_ab")


def test_emu_gap_ds_acc_data_gfx942():
    """The 128 x 128 lds tile in 64 x 64 wave tiles (284 registers) stages pieces from AGPRs
    (`ds_write_b128 v29, a[0:3]`, the DS ACC bit); the emulator stored the VGPRs of those
    numbers instead."""
    c = gemm_family.config("lds", 128, 128, stages=2, wave_tile="w64x64")
    check_gap_shown("gfx942", c, (67, 72, 272), "ds_acc_data")


def test_emu_gap_scratch_per_wave_gfx950():
    """The 128 x 128 lds tile in 64 x 32 wave tiles on v_mfma_f32_32x32x16_fp8_fp8 spills 5
    registers (the tuner leaves it out, a user may still ask for it): its 8 waves each keep
    them in scratch across the K loop. The emulator gave the waves one scratch region, so each
    reloaded the spills of the wave that ran last."""
    from codegen import tune
    from codegen.build.resources import from_amdgpu_asm

    c = gemm_family.config("lds", 128, 128, stages=2, atom="32x32x16", wave_tile="w64x32")
    [(_, _, asm)] = tune.assemblies("gfx950", [c])
    assert from_amdgpu_asm(asm)["scratch_bytes"], "the config no longer spills: pick another"
    check_gap_shown("gfx950", c, (67, 72, 272), "scratch_per_wave")


def test_emu_gap_mfma_x2_decode_gfx950():
    """Two unscaled v_mfma_f32_16x16x128_f8f6f4 in a row: the emulator decoded the pair as one
    scaled MFMA (it matched VOP3PX2 by its second word only), so the second never ran and its
    accumulators kept stale registers."""
    c = gemm_family.config("lds", 64, 64, stages=2, atom="16x16x128")
    check_gap_shown("gfx950", c, (67, 136, 272), "mfma_x2_decode")


def test_emu_gap_mfma_x2_decode_any_instruction_before():
    """The same match took any 8 bytes before an f8f6f4 MFMA as the scale word: here
    v_pk_fma_f32 v[0:1], v[2:3], v[4:5], v[6:7], then v_mfma_f32_16x16x128_f8f6f4 v[0:3],
    v[4:11], v[12:19], 0 (llvm-mc's gfx950 encodings). The fix decodes the first as itself."""
    from codegen.emu import gaps

    tinygrad_emu = emu.emulator()
    code = bytes([0x00, 0x40, 0xb0, 0xd3, 0x02, 0x09, 0x1a, 0x1c,
                  0x00, 0x00, 0xad, 0xd3, 0x04, 0x19, 0x02, 0x02])
    inst = tinygrad_emu.decode_inst(code, "cdna")
    assert type(inst).__name__ == "VOP3P" and inst.op.name == "V_PK_FMA_F32", inst
    with gaps.disabled("mfma_x2_decode"):
        assert type(tinygrad_emu.decode_inst(code, "cdna")).__name__ == "VOP3PX2"
