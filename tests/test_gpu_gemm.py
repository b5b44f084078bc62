"""L5: the FP8 block-scale GEMM on the GPU vs the fp64 torch reference (docs/numerics.md)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codegen import ops, reference
from codegen.families import gemm as fam
from codegen.spec import make_variant, validate
from codegen.targets import device_arch, get_target

from . import checks
from .checks import check_gemm as check
from .checks import rel_err
from .gpu_data import fp8_info, poison_, rows_with_spread

pytestmark = pytest.mark.gpu

MS = [1, 7, 16, 32, 64, 83, 128, 1024, 4096, 8192]
NKS = [(2112, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
       (7168, 2048)]


@pytest.fixture(scope="module", autouse=True)
def report_excess():
    yield
    excess = checks.MEASURED.get("gemm_row_excess")
    print(f"\nGEMM: largest error past a bf16 ulp, of its row's mean |ref|: {excess} "
          f"(bound {reference.GEMM_ROW_TOL})")
    if os.environ.get("OUT") and excess is not None:
        with open(os.path.join(os.environ["OUT"], "gemm_row_excess.json"), "w") as f:
            json.dump({"gemm_row_excess": excess, "bound": reference.GEMM_ROW_TOL}, f)


def quant_blocks(x: torch.Tensor, rows: int, cols: int = 128):
    return checks.quant_blocks(x, rows, *fp8_info(), cols)


def make(m, n, k, gen=None):
    a, sa = quant_blocks(rows_with_spread(m, k, torch.float32, gen=gen), 1)
    b, sb = quant_blocks(torch.randn(n, k, device="cuda", generator=gen) * 0.05, 128)
    return a, sa, b, sb




def poisoned_alloc(m, n):
    """Leave a NaN-filled block in the allocator where the output will go."""
    junk = poison_(torch.empty((m, n), dtype=torch.bfloat16, device="cuda"))
    del junk


@pytest.mark.parametrize("n,k", NKS)
@pytest.mark.parametrize("m", MS)
def test_gemm_dispatch_parity(m, n, k):
    a, sa, b, sb = make(m, n, k)
    poisoned_alloc(m, n)
    check(ops.gemm_a8w8_blockscale(a, sa, b, sb), a, sa, b, sb)


@pytest.mark.parametrize("n,k", [(1000, 512), (3000, 2048), (10000, 512), (7000, 1536),
                                 (1000, 7168), (5000, 4096)])
def test_decode_dispatch_parity_without_a_table_entry(n, k):
    """M = 1 at shapes no table has: the heuristic's pick by N and K, through dispatch."""
    test_gemm_dispatch_parity(1, n, k)


def built_configs():
    arch = device_arch(torch.device("cuda")) if torch.cuda.is_available() else "sm_90a"
    return [dict(v.params) for v in fam.variants(get_target(arch))]


@pytest.fixture(scope="module", autouse=True)
def every_built_config_compiled():
    """Every built config into the JIT cache side by side first: compiled one at a time on first
    use, a fresh cache took minutes (nothing to do where an ahead-of-time build is current)."""
    from codegen.tune import compile_all

    axes = fam.config("mma", 16, 16)
    compile_all(device_arch(torch.device("cuda")),
                [{key: params[key] for key in axes} for params in built_configs()])


@pytest.mark.parametrize("shape", [(1, 576, 3888), (83, 2112, 7168), (130, 200, 512),
                                   (257, 4096, 256), (16, 7168, 2048), (70, 100, 256),
                                   (33, 2050, 128)])
def test_every_built_config(shape):
    """Every config a build compiles, on tails in M, N and K (K % 128 != 0: zeros past K)."""
    m, n, k = shape
    a, sa, b, sb = make(m, n, k)
    for params in built_configs():
        cfg = {key: params[key] for key in fam.config("mma", 16, 16)}   # every config axis
        poisoned_alloc(m, n)
        out = ops.gemm.gemm_with_config(a, sa, b, sb, cfg)
        check(out, a, sa, b, sb)


def lds_configs():
    arch = device_arch(torch.device("cuda")) if torch.cuda.is_available() else "sm_90a"
    target = get_target(arch)
    cfgs = [fam.config("lds", bm, bn, stages=2) for bm in (32, 64, 128) for bn in (32, 64, 128)]
    return [c for c in cfgs if validate(make_variant(fam.FAMILY, arch,
                                                     fp8=target.fp8_formats[0].token, **c)) is None]


def test_lds_kernel():
    """The LDS-staged kernel (the large-M GEMM on AMD) in every valid tile of this GPU, on tails
    in M, N and K and with more than one weight-scale block along N."""
    cfgs = lds_configs()
    assert cfgs, "no valid lds config on this GPU"
    for m, n, k in [(1, 576, 3888), (83, 2112, 7168), (130, 200, 512), (257, 4096, 256),
                    (33, 2050, 128)]:
        a, sa, b, sb = make(m, n, k)
        for cfg in cfgs:
            poisoned_alloc(m, n)
            check(ops.gemm.gemm_with_config(a, sa, b, sb, cfg), a, sa, b, sb)


def test_gemv_kernel():
    """The decode kernel in every config the tuner may pick: M from 1 to past block_m (grid y),
    N not a multiple of the block's rows, K not a multiple of the lanes' 16-byte pieces."""
    from codegen.tune import candidates

    arch = device_arch(torch.device("cuda"))
    cfgs = [c for c in candidates(arch) if c["kernel"] == "gemv"]
    assert cfgs
    for m, n, k in [(1, 576, 3888), (1, 2112, 7168), (2, 7, 256), (3, 100, 512), (5, 4099, 144)]:
        a, sa, b, sb = make(m, n, k)
        for cfg in cfgs:
            poisoned_alloc(m, n)
            check(ops.gemm.gemm_with_config(a, sa, b, sb, cfg), a, sa, b, sb)


def test_mma_cluster_kernel():
    """sm_90a's mma kernel with a tile's K blocks split over a cluster of blocks, in every config
    the tuner may pick: tails in M, N and K, fewer K blocks than waves, more than one pass over
    them. Two calls and a graph replay agree to the bit (a fixed order of summation)."""
    from codegen.tune import candidates, compile_all

    if device_arch(torch.device("cuda")) != "sm_90a":
        pytest.skip("clusters are sm_90a's")
    cfgs = [c for c in candidates("sm_90a") if c["kernel"] == "mma" and c["cluster"] > 1]
    assert cfgs
    compile_all("sm_90a", cfgs)
    for m, n, k in [(1, 576, 3888), (1, 4096, 7168), (5, 2050, 7168), (16, 100, 256),
                    (3, 7168, 16384), (9, 300, 144)]:
        a, sa, b, sb = make(m, n, k)
        for cfg in cfgs:
            poisoned_alloc(m, n)
            one = ops.gemm.gemm_with_config(a, sa, b, sb, cfg)
            check(one, a, sa, b, sb)
            assert torch.equal(ops.gemm.gemm_with_config(a, sa, b, sb, cfg), one), cfg
    cfg = cfgs[0]
    a, sa, b, sb = make(1, 2112, 7168)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        replayed = ops.gemm.gemm_with_config(a, sa, b, sb, cfg)
    poison_(replayed)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, ops.gemm.gemm_with_config(a, sa, b, sb, cfg))


def test_tma_kernel():
    """sm_90a's persistent TMA kernel in every tile the tuner may pick: tails in M, N and K,
    output rows that are not 16-byte aligned (N % 8 != 0: stored from registers), more tiles
    than SMs (each CTA walks several)."""
    from codegen.tune import candidates, compile_all

    if device_arch(torch.device("cuda")) != "sm_90a":
        pytest.skip("the tma kernel is sm_90a's")
    cfgs = [c for c in candidates("sm_90a") if c["kernel"] == "tma"]
    assert cfgs
    compile_all("sm_90a", cfgs)
    for m, n, k in [(1, 576, 3888), (83, 2112, 7168), (130, 200, 512), (33, 2050, 128),
                    (70, 100, 256), (1000, 2112, 1024), (300, 7168, 384)]:
        a, sa, b, sb = make(m, n, k)
        for cfg in cfgs:
            poisoned_alloc(m, n)
            check(ops.gemm.gemm_with_config(a, sa, b, sb, cfg), a, sa, b, sb)


def test_stream_k_is_deterministic_and_graph_safe():
    """Shapes whose last, partial round of tiles the tma kernel splits in K (partial sums
    through a workspace from the launcher's pool, flags cleared before each launch), on 132
    SMs: 7 pieces per tile alone (83 rows) and after whole rounds (4096), 3 pieces in 2-CTA
    clusters and with one consumer warpgroup on a straddling width. Two calls agree to the
    bit, as do a graph replay and calls running at once on two streams."""
    if device_arch(torch.device("cuda")) != "sm_90a":
        pytest.skip("the tma kernel is sm_90a's")
    for (m, n, k), cfg in [((83, 2112, 7168), fam.config("tma", 128, 128, stages=5)),
                           ((4096, 2112, 7168), fam.config("tma", 128, 128, stages=5)),
                           ((256, 2112, 7168), fam.config("tma", 128, 128, stages=4, cluster=2)),
                           ((70, 2112, 16384), fam.config("tma", 64, 112, stages=6))]:
        a, sa, b, sb = make(m, n, k)
        call = lambda: ops.gemm.gemm_with_config(a, sa, b, sb, cfg)  # noqa: E731
        poisoned_alloc(m, n)
        one = call()
        check(one, a, sa, b, sb)
        assert torch.equal(call(), one)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            replayed = call()
        for _ in range(2):
            poison_(replayed)
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(replayed, one)
        streams = [torch.cuda.Stream() for _ in range(2)]
        torch.cuda.synchronize()
        outs = []
        for s in streams:
            with torch.cuda.stream(s):
                outs += [call() for _ in range(3)]
        torch.cuda.synchronize()
        assert all(torch.equal(o, one) for o in outs)


def test_stream_k_first_call_inside_a_graph_capture():
    """The launcher's first call (its workspace pool created then) may come inside a capture."""
    if device_arch(torch.device("cuda")) != "sm_90a":
        pytest.skip("the tma kernel is sm_90a's")
    code = """if True:
        import torch
        from codegen import ops
        m, n, k = 4096, 2112, 7168
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.rand(m, k // 128, device="cuda") + 0.5
        sb = torch.rand(-(-n // 128), k // 128, device="cuda") + 0.5
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = ops.gemm_a8w8_blockscale(a, sa, b, sb)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ops.gemm_a8w8_blockscale(a, sa, b, sb))
        print("ok")
    """
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=Path(__file__).resolve().parent.parent)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-2000:]


@pytest.mark.parametrize("layout", ["row", "col", "col_tma"])
def test_end_to_end_rmsnorm_quant_gemm(layout):
    """rmsnorm_group_quant -> gemm, scales consumed as produced, vs a bf16 reference."""
    t, h, n = 83, 7168, 2112
    x = rows_with_spread(t, h, torch.bfloat16)
    w = torch.rand(h, device="cuda", dtype=torch.bfloat16) + 0.5
    q, s = ops.rmsnorm_group_quant(x, w, 1e-6, 128, scale_layout=layout)
    wf = torch.randn(n, h, device="cuda") * 0.05
    b, sb = quant_blocks(wf, 128)
    out = ops.gemm_a8w8_blockscale(q, s, b, sb)
    check(out, q, s.contiguous(), b, sb)
    xn = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    ref = (xn.to(torch.bfloat16).float() @ wf.t()).to(torch.bfloat16)
    assert rel_err(out, ref) < 0.05


def test_strided_rows_and_scale_strides():
    m, n, k = 37, 576, 1024
    a_full, sa, b, sb = make(m, n, k + 256)
    a = a_full[:, :k]                       # row stride k + 256
    sa = sa[:, : k // 128]
    sa_t = sa.t().contiguous().t()          # column-major scales
    sb_t = sb[:, : k // 128].t().contiguous().t()
    out = ops.gemm_a8w8_blockscale(a, sa_t, b[:, :k], sb_t)
    check(out, a, sa, b[:, :k].contiguous(), sb[:, : k // 128])


def scale_layouts(sa: torch.Tensor) -> dict[str, torch.Tensor]:
    """sa [M, KB] in the layouts callers pass, the padding of each row or column NaN."""
    m, kb = sa.shape

    def col(pad):
        store = torch.full((kb, -(-m // pad) * pad), float("nan"), device=sa.device)
        store[:, :m] = sa.t()
        return store[:, :m].t()

    def row(pitch):
        store = torch.full((m, pitch), float("nan"), device=sa.device)
        store[:, :kb] = sa
        return store[:, :kb]

    return {"col_tma": col(4), "col": col(1), "row": row(kb), "row_pitch_4": row(kb // 4 * 4 + 4),
            "row_odd_pitch": row(kb + 1)}


def test_tma_scale_layouts():
    """sm_90a's tma tiles with A's scales in each layout: narrow tiles' staged build copies them
    with the stages where they are column-major in 16-byte aligned columns (col_tma), the other
    builds read them in place; the NaN padding never reaches a stored row. Tails in M, N and K."""
    if device_arch(torch.device("cuda")) != "sm_90a":
        pytest.skip("the tma kernel is sm_90a's")
    cfgs = [c for c in built_configs() if c["kernel"] == "tma"]
    assert any(fam.tma_staged_bytes(make_variant(fam.FAMILY, "sm_90a", **c)) for c in cfgs)
    for m, n, k in [(83, 2112, 7168), (7, 576, 3888), (130, 200, 512), (16, 7168, 2048)]:
        a, sa, b, sb = make(m, n, k)
        for layout, sa_in in scale_layouts(sa).items():
            for params in cfgs:
                cfg = {key: params[key] for key in fam.config("mma", 16, 16)}
                poisoned_alloc(m, n)
                check(ops.gemm.gemm_with_config(a, sa_in, b, sb, cfg), a, sa, b, sb)


def test_empty():
    a, sa, b, sb = make(4, 256, 256)
    assert ops.gemm_a8w8_blockscale(a[:0], sa[:0], b, sb).shape == (0, 256)
    assert ops.gemm_a8w8_blockscale(a, sa, b[:0], sb[:0]).shape == (4, 0)


@pytest.mark.parametrize("m,n,k", [(1, 576, 3884), (4, 576, 3884), (83, 576, 3884),
                                   (1024, 576, 3884), (7, 200, 100)])
def test_k_not_a_multiple_of_16(m, n, k):
    """N = 576, K = 3884 through the decode, small-M and large-M kernels, and a K under
    one block: read as zero-padded rows."""
    a, sa, b, sb = make(m, n, k)
    poisoned_alloc(m, n)
    checks.check_gemm_unaligned_k(a, sa, b, sb)


def test_bad_inputs_name_the_argument():
    a, sa, b, sb = make(4, 256, 256)
    with pytest.raises(TypeError, match="a:"):
        ops.gemm_a8w8_blockscale(a.to(torch.bfloat16), sa, b, sb)
    with pytest.raises(TypeError, match="a_scales:"):
        ops.gemm_a8w8_blockscale(a, sa.half(), b, sb)
    with pytest.raises(ValueError, match="b_scales:"):
        ops.gemm_a8w8_blockscale(a, sa, b, sb[:1])
    with pytest.raises(ValueError, match="b:"):
        ops.gemm_a8w8_blockscale(a, sa, b[:, :128], sb)
    with pytest.raises(ValueError, match="b:"):
        ops.gemm_a8w8_blockscale(a, sa, b.cpu(), sb)


def test_compile_and_graph():
    a, sa, b, sb = make(16, 2112, 7168)
    eager = ops.gemm_a8w8_blockscale(a, sa, b, sb)
    f = torch.compile(ops.gemm_a8w8_blockscale, fullgraph=True)
    assert torch.equal(f(a, sa, b, sb), eager)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.gemm_a8w8_blockscale(a, sa, b, sb)
    poison_(out)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_dependent_chain_in_a_graph_equals_synchronized_steps():
    """Each op reads what the op before it wrote, launched back to back (on Hopper with
    programmatic dependent launch, so a kernel may start before the one before it ends): a
    graph replay and eager calls equal the same steps run one at a time with a sync after each."""
    t, h = 512, 7168
    w = torch.rand(h, device="cuda", dtype=torch.bfloat16) + 0.5
    b, sb = quant_blocks(torch.randn(h, h, device="cuda") * 0.05, 128)
    x0, r0 = rows_with_spread(t, h, torch.bfloat16), rows_with_spread(t, h, torch.bfloat16)

    def chain(x, r, step):
        for _ in range(3):
            y = step(ops.fused_add_rmsnorm(x, r, w))   # r updated in place
            q, s = step(ops.rmsnorm_group_quant(y, w, 1e-6, 128))
            x = step(ops.gemm_a8w8_blockscale(q, s, b, sb))
            q, s = step(ops.per_token_group_quant_fp8(x, 128))
            x = step(ops.gemm_a8w8_blockscale(q, s, b, sb))
        return x

    def synced(v):
        torch.cuda.synchronize()
        return v

    r_ref = r0.clone()
    ref = chain(x0, r_ref, synced)
    r_eager = r0.clone()
    assert torch.equal(chain(x0, r_eager, lambda v: v), ref) and torch.equal(r_eager, r_ref)
    x, r = x0.clone(), r0.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = chain(x, r, lambda v: v)
    for _ in range(3):
        r.copy_(r0)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref) and torch.equal(r, r_ref)
