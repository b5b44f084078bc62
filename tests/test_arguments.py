"""Bad input gets an error that names the argument, on the CPU: the ops' checks run against a
stand-in device whose kernels do nothing, so what is tested is what reaches a launch.

Operands a kernel writes share no memory with the others (the kernels read and write rows in
no particular order), checks kept per call signature still hold for the calls after, and
parameters of the wrong type or range are refused before they reach a kernel.
"""
import warnings

import pytest
import torch

from codegen import ops, vllm
from codegen import nn as cnn
from codegen.ops import _common, _fast

BF = torch.bfloat16


class NoOpKernels:
    """A stand-in device: every kernel loads, and a launch does nothing."""
    arch = "sm_90a"
    multiprocessors = 132

    def __init__(self):
        self.launches = 0
        self.launched = []     # the variant of each launch
        self.args = []         # and its arguments (pointers, sizes, strides; the stream last)

    def kernel(self, variant):
        def launch(*args):
            self.launches += 1
            self.launched.append(variant)
            self.args.append(args)
            return 0
        return launch


@pytest.fixture
def device():
    dev = NoOpKernels()
    _common.attach_emulated(dev)
    yield dev
    _common.attach_emulated(None)


def rows(t, h, dtype=BF):
    return torch.randn(t, h).to(dtype)


def test_written_operands_share_no_memory_with_the_others(device):
    x, w, r = rows(4, 256), rows(1, 256)[0], rows(4, 256)
    buf = torch.zeros(5 * 256, dtype=BF)
    shifted_x, shifted_y = buf[256:].view(4, 256), buf[:1024].view(4, 256)
    y = torch.empty_like(x)
    x_as_fp8 = torch.empty(0, dtype=torch.float8_e4m3fn).set_(x.untyped_storage(), 0,
                                                              (4, 256), (256, 1))
    cases = [
        (lambda: ops.rmsnorm(x, y[0], out=y), "out: overlaps weight"),
        (lambda: ops.rmsnorm(shifted_x, w, out=shifted_y), "out: overlaps x"),
        (lambda: ops.fused_add_rmsnorm(x, r, w, out=r), "out: overlaps residual"),
        (lambda: ops.fused_add_rmsnorm(shifted_x, shifted_y, w), "residual: overlaps x"),
        (lambda: ops.fused_add_rmsnorm(x, r, r[1]), "residual: overlaps weight"),
        (lambda: ops.fused_add_rmsnorm(x, r, w, residual_out=shifted_y, out=shifted_x),
         "out: overlaps residual_out"),
        (lambda: ops.rmsnorm_group_quant(shifted_x, w, residual=shifted_y),
         "residual: overlaps x"),
        (lambda: ops.rmsnorm_group_quant(x, r[2], residual=r), "residual: overlaps weight"),
        (lambda: ops.per_token_group_quant_fp8(x, out=x_as_fp8), "out: overlaps x"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert device.launches == 0
    # in place where the op says so, and columns of one buffer side by side
    ops.rmsnorm(x, w, out=x)
    ops.fused_add_rmsnorm(x, r, w, out=x)
    ops.fused_add_rmsnorm(x, r, w, residual_out=r)
    wide = rows(4, 512)
    ops.fused_add_rmsnorm(wide[:, :256], wide[:, 256:], w)
    ops.rmsnorm_group_quant(wide[:, :256], w, residual=wide[:, 256:])
    assert device.launches == 5


def test_checks_kept_per_signature_hold_for_the_calls_after(device):
    # a last dim that is not contiguous passes with no rows, and must not with four
    strided = torch.randn(4, 512).to(BF)[:, ::2]
    ops.per_token_group_quant_fp8(strided[:0])
    with pytest.raises(ValueError, match="x: last dim must be contiguous"):
        ops.per_token_group_quant_fp8(strided)
    # the same tensor as residual, then as residual_out alone: two signatures
    x, w, r = rows(4, 256), rows(1, 256)[0], rows(4, 256)
    ops.rmsnorm_group_quant(x, w, residual=r)
    with pytest.raises(ValueError, match="residual_out: given without residual"):
        ops.rmsnorm_group_quant(x, w, residual_out=r)
    # a contiguous last dim, then a strided one of the same shape
    ops.per_token_group_quant_fp8(rows(4, 256))
    with pytest.raises(ValueError, match="x: last dim must be contiguous"):
        ops.per_token_group_quant_fp8(rows(4, 512)[:, ::2])
    # one row of row stride 0 (one row cannot overlap), then rows of that stride, which do
    same_row = rows(1, 256).expand(4, 256)
    ops.rmsnorm(same_row[:1], w)
    for n in (2, 4):
        with pytest.raises(ValueError, match="x: row stride 0 is smaller"):
            ops.rmsnorm(same_row[:n], w)
        with pytest.raises(ValueError, match="residual: row stride 0 is smaller"):
            ops.fused_add_rmsnorm(rows(n, 256), same_row[:n], w)
    # the row counts a plan leaves open: a residual or kv with fewer rows than x or q
    ops.fused_add_rmsnorm(x, r, w)
    ops.dual_rmsnorm_group_quant(x, w, x, w)
    launches = device.launches
    for call, message in ((lambda: ops.fused_add_rmsnorm(x, r[:3], w), "residual: shape"),
                          (lambda: ops.rmsnorm_group_quant(x, w, residual=r[:3]),
                           "residual: shape"),
                          (lambda: ops.dual_rmsnorm_group_quant(x, w, x[:3], w), "kv: 3 rows")):
        with pytest.raises(ValueError, match=message):
            call()
    assert device.launches == launches


def test_parameters_of_the_wrong_type_or_range(device):
    x, w = rows(4, 256), rows(1, 256)[0]
    for eps, error in ((1e300, ValueError), (3.5e38, ValueError), ("1e-6", TypeError),
                       (torch.tensor(1e-6), TypeError), (True, TypeError)):
        with pytest.raises(error, match="eps"):
            ops.rmsnorm(x, w, eps)
        with pytest.raises(error, match="eps"):
            ops.rmsnorm_group_quant(x, w, eps)
    for call in (lambda: ops.per_token_group_quant_fp8(x, 128.0),
                 lambda: ops.rmsnorm_group_quant(x, w, 1e-6, 128.0),
                 lambda: vllm.rms_norm_per_block_quant(x, w, 1e-6, torch.float8_e4m3fn,
                                                       [1, 128.0])):
        with pytest.raises(TypeError, match="group_size: expected an int"):
            call()
    for call, error, message in (
            (lambda: ops.per_token_group_quant_fp8(x, 16), ValueError, "group_size: 16"),
            (lambda: ops.rmsnorm(rows(4, 0), w[:0]), ValueError, "x: hidden size must be > 0"),
            (lambda: ops.rmsnorm_group_quant(rows(4, 256, torch.float32), w.float()), TypeError,
             "x: dtype"),
            (lambda: ops.dual_rmsnorm_group_quant(x, w, rows(4, 260), rows(1, 260)[0]),
             ValueError, "kv: hidden size 260 is not a multiple of 8"),
            (lambda: ops.dual_rmsnorm_group_quant(rows(1, 8320), rows(1, 8320)[0], x[:1], w),
             ValueError, "q: hidden size 8320 exceeds 8192")):
        with pytest.raises(error, match=message):
            call()
    assert device.launches == 0
    ops.dual_rmsnorm_group_quant(rows(1, 8192), rows(1, 8192)[0], x[:1], w)   # the longest
    ops.rmsnorm(x, w, 0.0)                                                     # eps may be 0
    assert device.launches == 2
    device.launches = 0
    # a flag given as "no" (truthy) or 2 is refused, with and without a plan for True
    for flag in (False, True, "no", "", 2, None):
        calls = ((lambda: ops.per_token_group_quant_fp8(x, ue8m0=flag), "ue8m0"),
                 (lambda: ops.rmsnorm_group_quant(x, w, ue8m0=flag), "ue8m0"),
                 (lambda: ops.rmsnorm_group_quant(x, w, also_return_unquantized=flag),
                  "also_return_unquantized"),
                 (lambda: ops.dual_rmsnorm_group_quant(x, w, x, w, ue8m0=flag), "ue8m0"))
        for call, name in calls:
            if isinstance(flag, bool):
                call()
            else:
                with pytest.raises(TypeError, match=f"{name}: expected a bool"):
                    call()
    assert device.launches == 8
    # parameters no plan has are not kept, whatever they are
    before = len(_fast.IDS)
    for _ in range(3):
        with pytest.raises(TypeError, match="eps"):
            ops.rmsnorm(x, w, torch.tensor(1e-6))
    assert len(_fast.IDS) == before


def test_vllm_names(device):
    x = rows(4, 256)
    with pytest.raises(ValueError, match="dtype: torch.float8_e5m2 is not"):
        vllm.per_token_group_quant_fp8(x, 128, dtype=torch.float8_e5m2)
    fp8 = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="output_dtype: torch.int8"):
        vllm.w8a8_triton_block_scaled_mm(fp8, fp8, torch.ones(4, 2), torch.ones(1, 2),
                                         [128, 128], torch.int8)
    # an output written in place that is no view of rows: an error, not a write to a copy
    not_rows = torch.zeros(2, 256, 2, dtype=BF).transpose(1, 2)
    with pytest.raises(ValueError, match="out: strides"):
        vllm.rms_norm(not_rows, torch.zeros(2, 2, 256, dtype=BF), None, 1e-6)
    with pytest.raises(ValueError, match="residual: strides"):
        vllm.fused_add_rms_norm(torch.zeros(2, 2, 256, dtype=BF), not_rows, None, 1e-6)
    assert device.launches == 0


def test_entry_points_name_their_own_arguments(device):
    """The vLLM / AITER entry points and the modules: errors name their arguments, and tensors
    paired row by row must have one shape (flattened, [2, 3, H] and [3, 2, H] pair wrongly)."""
    from codegen import aiter

    x, w, r = rows(6, 256), rows(1, 256)[0], rows(6, 256)
    fp8 = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    cases = [
        (lambda: ops.gemm_a8w8_blockscale(None, torch.ones(4, 2), fp8, torch.ones(2, 2)),
         "a: expected a torch.Tensor"),
        (lambda: vllm.w8a8_triton_block_scaled_mm(None, fp8, torch.ones(4, 2), torch.ones(2, 2),
                                                  [128, 128]), "A: expected a torch.Tensor"),
        (lambda: aiter.gemm_a8w8_blockscale(fp8, rows(256, 256), torch.ones(256, 2),
                                            torch.ones(2, 2)), "WQ: "),
        (lambda: vllm.rms_norm_per_block_quant(x, w, 1e-6, torch.float8_e4m3fn, [1, 128],
                                               residual=r.view(3, 2, 256)), "residual: shape"),
        (lambda: vllm.rms_norm(torch.empty(6, 256, dtype=BF), x, w, True), "epsilon: "),
        (lambda: aiter.rms_norm_cu(torch.empty(6, 128, dtype=BF), x, w, 1e-6), "out: shape"),
        (lambda: aiter.rms_norm_cu(torch.empty(6, 256, dtype=BF), x, None, 1e-6), "weight: "),
        (lambda: aiter.fused_rms_fp8_group_quant(x, w, 1e-6, rows(6, 200), rows(1, 100)[0],
                                                 1e-6), "inp2_weight: shape"),
        (lambda: aiter.fused_rms_fp8_group_quant(x, w, 1e-6, res1=rows(5, 256)), "res1: "),
        (lambda: vllm.fused_add_rms_norm(x.view(2, 3, 256), r.view(3, 2, 256), w, 1e-6),
         "residual: shape"),
        (lambda: aiter.fused_add_rms_norm_cu(x.view(2, 3, 256), r.view(3, 2, 256), w, 1e-6),
         "residual_in: shape"),
        (lambda: aiter.rmsnorm2d_fwd_with_add(torch.empty(3, 2, 256, dtype=BF), x.view(2, 3, 256),
                                              r.view(2, 3, 256), torch.empty(2, 3, 256, dtype=BF),
                                              w, 1e-6), "out: shape"),
        (lambda: cnn.RMSNorm(256)(x.view(2, 3, 256), r.view(3, 2, 256)), "residual: shape"),
        (lambda: cnn.RMSNorm(256, quantize=True)(x.view(2, 3, 256), r.view(3, 2, 256)),
         "residual: shape"),
    ]
    for call, message in cases:
        with pytest.raises((TypeError, ValueError), match=message):
            call()
    assert device.launches == 0
    wide = rows(6, 512)          # vLLM's strided input, in place: computed, then copied back
    vllm.fused_add_rms_norm(wide[:, :256], r, w, 1e-6)
    aiter.fused_add_rms_norm_cu(wide[:, :256], r, w, 1e-6)
    assert device.launches == 2


def test_gemm_refuses_rows_that_overlap(device):
    fp8 = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    scales = torch.ones(256, 2), torch.ones(2, 2)
    for a, b, name in ((fp8[:1].expand(256, 256), fp8, "a"), (fp8, fp8[:1].expand(256, 256), "b"),
                       (fp8.view(-1)[:16 * 255 + 256].as_strided((256, 256), (16, 1)), fp8, "a")):
        with pytest.raises(ValueError, match=f"{name}: row stride .* smaller than K=256"):
            ops.gemm_a8w8_blockscale(a, scales[0], b, scales[1])
    with pytest.raises(ValueError, match="a: row stride 0 is smaller than K=256"):  # 2 rows
        ops.gemm_a8w8_blockscale(fp8[:1].expand(2, 256), torch.ones(2, 2), fp8, scales[1])
    ops.gemm_a8w8_blockscale(fp8[:1].expand(1, 256), torch.ones(1, 2), fp8, scales[1])  # 1 row
    assert device.launches == 1


def test_gemm_with_k_0_is_an_empty_sum(device):
    fp8 = torch.float8_e4m3fn
    a, b = torch.zeros(3, 16, dtype=fp8)[:, :0], torch.zeros(200, 16, dtype=fp8)[:, :0]
    out = ops.gemm_a8w8_blockscale(a, torch.ones(3, 0), b, torch.ones(2, 0))
    assert out.shape == (3, 200) and out.dtype == BF and not out.any()
    assert device.launches == 0


class On:
    """A tensor on device `index`, as the launch path asks it."""
    def __init__(self, index):
        self.index = index

    def get_device(self):
        return self.index


def test_a_launch_runs_with_its_tensors_device_current(monkeypatch):
    calls = []

    monkeypatch.setattr(_common, "_get_device", lambda: 0)
    monkeypatch.setattr(_common, "_set_device", lambda d: calls.append(("set", d)))
    monkeypatch.setattr(_common, "raw_stream", lambda d: 100 + d)
    assert _common.launch(lambda *a: calls.append(("launch", a)) or 7, On(1), "p") == 7
    assert calls == [("set", 1), ("launch", ("p", 101)), ("set", 0)]
    calls.clear()
    monkeypatch.setattr(_common, "_get_device", lambda: 1)
    _common.launch(lambda *a: calls.append(("launch", a)), On(1), "p")
    assert calls == [("launch", ("p", 101))]
    calls.clear()     # device 0 is a device like any other
    _common.launch(lambda *a: calls.append(("launch", a)), On(0), "p")
    assert calls == [("set", 0), ("launch", ("p", 100)), ("set", 1)]


def test_each_device_gets_the_kernel_of_its_own_arch(monkeypatch):
    """A host with two kinds of GPU: the launcher cache is kept per device, so a call on the
    second never takes the kernel built for the first."""
    from types import SimpleNamespace

    archs = {0: "gfx942", 1: "gfx1201"}
    monkeypatch.setattr(_common, "_launchers", {})
    monkeypatch.setattr(_common, "arch", lambda t: archs[t.index])
    monkeypatch.setattr(_common, "on_emulator", lambda t: False)
    monkeypatch.setattr(_common, "variant_for", lambda family, arch, **p: SimpleNamespace(
        uri=f"{family}-{arch}-{p['group']}"))
    monkeypatch.setattr(_common, "kernel", lambda v: f"launch {v.uri}")
    got = [_common.launcher("quant", On(d), group=g) for d in (0, 1, 0) for g in (128, 64)]
    assert [uri for _, uri in got] == ["quant-gfx942-128", "quant-gfx942-64",
                                       "quant-gfx1201-128", "quant-gfx1201-64",
                                       "quant-gfx942-128", "quant-gfx942-64"]
    assert got[0][0] == "launch quant-gfx942-128" and len(_common._launchers) == 4


def test_a_failed_launch_is_an_error_whatever_its_code():
    _common.check_rc(0, "quant")
    for rc in (1, 700, -1):
        with pytest.raises(RuntimeError, match=f"quant: kernel launch failed with GPU runtime "
                                               f"error {rc}"):
            _common.check_rc(rc, "quant")


def test_overlap_is_exact_for_rows_of_one_stride_and_by_spans_otherwise():
    b = torch.zeros(8, 32)
    f = b.view(-1)
    cases = [
        (b[:, :16], b[:, 16:], False), (b[:, :17], b[:, 16:], True),   # columns side by side
        (b[:4], b[4:], False), (b[:4], b[3:], True),                     # spans end to end
        (b[0], b[1], False),                                             # two 1-D rows
        (b[1, :16], b[:, 16:], False), (b[1, 16:20], b[:, 16:], True),   # a row against columns
        (b[:, 16:], b[1, :16], False), (b[2:4, :16], b[:2, :16], False),
        (b[:, ::2], b[:, 1::2], True),                                   # interleaved: by spans
        (b[::2, :8], b[::3, :8], True),                                  # rows 0 and 6 meet
        (f[:40], b[1:, :8], True), (f[:32], b[1:, :8], False),
        (f[:32:2], f[20:30], True), (f[:32:2], f[32:40], False),
        (f.as_strided((4, 8), (64, 1)), f[32:].as_strided((3, 8), (96, 1)), True),   # at 128
        (b[:1, :8].expand(4, 8), b[0, 4:6], True),                       # a row stride of 0
        (b[2:2], b[1:3], False)]                                         # empty
    for a, c, want in cases:
        assert _common.overlap(a, c) == want, (a.shape, a.stride(), c.shape, c.stride())
        assert _common.overlap(c, a) == want


def test_only_the_in_place_operand_itself_may_be_written():
    b = torch.zeros(4, 32)
    _common.check_written("residual_out", b, "residual", residual=b)
    for t, o in ((b[:, :16], b[:, :24]), (b[:2], b.view(2, 64)),
                 (b[:4, :16], b.view(-1)[:64].view(4, 16))):   # same start, other rows
        with pytest.raises(ValueError, match="residual_out: overlaps residual; it must be "
                                             "residual itself"):
            _common.check_written("residual_out", t, "residual", residual=o)
    with pytest.raises(ValueError, match="out: overlaps x; it must share no memory"):
        _common.check_written("out", b, None, x=b)


def test_rmsnorm_module_updates_a_residual_that_reshape_copies(monkeypatch):
    """A 3-D residual whose rows are not a view: the op writes a copy, which goes back."""
    seen = {}

    def fused_add(x2, r2, w, eps):
        seen["copy"] = r2.data_ptr() != residual.data_ptr()
        r2.add_(1)
        return x2.clone()
    monkeypatch.setattr(ops, "fused_add_rmsnorm", fused_add)
    norm = cnn.RMSNorm(256)
    residual = torch.zeros(2, 3, 256, dtype=BF).transpose(0, 1)     # [3, 2, 256], not rows
    _, out = norm(torch.zeros(3, 2, 256, dtype=BF), residual)
    assert seen["copy"] and out is residual and (residual == 1).all()


@pytest.fixture
def cpu_impls(device):
    """The ops' implementations registered for CPU tensors too, for this test only (they run
    the stand-in device's kernels), so that compiled graphs execute here."""
    import importlib

    gemm, quant, rmsnorm = (importlib.import_module(f"codegen.ops.{m}")   # the modules, not
                            for m in ("gemm", "quant", "rmsnorm"))        # the ops of their names
    lib = torch.library.Library("codegen", "IMPL")
    for name, fn in (("rmsnorm", rmsnorm._rmsnorm_impl),
                     ("fused_add_rmsnorm", rmsnorm._fused_add_impl),
                     ("rmsnorm_group_quant", rmsnorm._rgq_impl),
                     ("dual_rmsnorm_group_quant", rmsnorm._dual_impl),
                     ("per_token_group_quant_fp8", quant._impl),
                     ("gemm_a8w8_blockscale", gemm._impl)):
        lib.impl(name, fn, "CPU")
    yield device
    lib._destroy()


def test_compiled_with_dynamic_shapes_one_graph_each(cpu_impls):
    """torch.compile(fullgraph=True, dynamic=True): every op traces once with a symbolic T
    (T = 5, 9, 17 share one graph: no cache written while tracing forces a second)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    w, kw, fp8 = rows(1, 256)[0], rows(1, 512)[0], torch.float8_e4m3fn
    cases = {
        "rmsnorm": lambda x, e: ops.rmsnorm(x, w, e),
        "fused_add_rmsnorm": lambda x, e: ops.fused_add_rmsnorm(x, x.clone(), w, e),
        "rmsnorm_group_quant": lambda x, e: ops.rmsnorm_group_quant(x, w, e, 128,
                                                                    scale_layout="col_tma"),
        "dual": lambda x, e: ops.dual_rmsnorm_group_quant(x, w, torch.cat([x, x], 1), kw, e),
        "quant + gemm": lambda x, e: ops.gemm_a8w8_blockscale(
            *ops.per_token_group_quant_fp8(x, 128, scale_layout="col"),
            torch.zeros(384, 256, dtype=fp8), torch.ones(3, 2)),
    }
    for name, fn in cases.items():
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="eager")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for t in (5, 9, 17):
                compiled(rows(t, 256), 1e-5)
        assert counters["stats"]["unique_graphs"] == 1, (name, dict(counters["stats"]))
        # nothing of ours for an engine's log, nor dynamo's note on tracing into a cache
        assert not [str(w.message) for w in seen
                    if "lru_cache" in str(w.message) or "codegen" in w.filename], name


_SAME_TENSOR_TWICE = {
    "out": lambda w: lambda x, r: ops.fused_add_rmsnorm(x, r, w, out=r),
    "residual": lambda w: lambda x, r: ops.fused_add_rmsnorm(x, x, w),
    "residual_out": lambda w: lambda x, r: ops.fused_add_rmsnorm(x, r, w, residual_out=x),
    "residual (norm + quant)": lambda w: lambda x, r: ops.rmsnorm_group_quant(x, w, 1e-6, 128,
                                                                              residual=x),
}


@pytest.mark.parametrize("case", list(_SAME_TENSOR_TWICE))
def test_compiled_calls_refuse_written_operands_that_are_others(cpu_impls, case):
    """Eager calls refuse these by address; traced ones have none, but the same tensor given
    twice is told apart by identity, so a compiled call refuses what its eager call does.
    aot_eager: the graph runs the ops on functionalized copies, so only the trace can refuse."""
    import torch._dynamo

    torch._dynamo.reset()
    fn = _SAME_TENSOR_TWICE[case](rows(1, 256)[0])
    with pytest.raises(Exception, match=f"{case.split()[0]}: overlaps"):
        torch.compile(fn, fullgraph=True, backend="aot_eager")(rows(4, 256), rows(4, 256))


def test_registered_ops_check_their_operands(cpu_impls):
    """torch.ops.codegen.* called directly (as integrations do) has had no other check: each
    refuses what its op refuses, naming the argument, before any launch."""
    x, w, r = rows(8, 256), rows(1, 256)[0], rows(8, 256)
    fp8 = torch.float8_e4m3fn
    cases = [
        (lambda: torch.ops.codegen.rmsnorm(x, rows(1, 16)[0], 1e-6), "weight: shape"),
        (lambda: torch.ops.codegen.rmsnorm(rows(8, 256, torch.float64), w, 1e-6), "x: dtype"),
        (lambda: torch.ops.codegen.fused_add_rmsnorm(x, rows(2, 256), w, 1e-6), "residual: shape"),
        (lambda: torch.ops.codegen.fused_add_rmsnorm(x, rows(8, 256, torch.float32), w, 1e-6),
         "residual: dtype"),
        (lambda: torch.ops.codegen.rmsnorm_group_quant(x, w, rows(2, 256), 1e-6, 128, "row",
                                                       False, False, 448.0, fp8),
         "residual: shape"),
        (lambda: torch.ops.codegen.rmsnorm_group_quant(x, w, None, 1e-6, 128, "row", False,
                                                       False, 448.0, torch.float8_e5m2),
         "fp8_dtype"),
        (lambda: torch.ops.codegen.dual_rmsnorm_group_quant(x, w, rows(4, 256), w, 1e-6, 128,
                                                            "row", False, 448.0, fp8),
         "kv: 4 rows"),
        (lambda: torch.ops.codegen.per_token_group_quant_fp8(rows(8, 200), 128, "row", False,
                                                             448.0, fp8), "x: hidden size 200"),
        (lambda: torch.ops.codegen.per_token_group_quant_fp8(rows(8, 512)[:, ::2], 128, "row",
                                                             False, 448.0, fp8),
         "x: last dim must be contiguous"),
    ]
    for call, message in cases:
        with pytest.raises((TypeError, ValueError), match=message):
            call()
    assert cpu_impls.launches == 0
    torch.ops.codegen.fused_add_rmsnorm(x, r, w, 1e-6)
    torch.ops.codegen.per_token_group_quant_fp8(x, 128, "row", False, 448.0, fp8)
    assert cpu_impls.launches == 2


def test_parameters_equal_to_a_plans_but_of_another_type(device):
    """128.0 == 128 and True == 1.0 hash alike: a plan made by the one must not take the other."""
    x, w = rows(4, 256), rows(1, 256)[0]
    ops.per_token_group_quant_fp8(x, 128)
    ops.rmsnorm_group_quant(x, w, 1.0, 128)
    ops.dual_rmsnorm_group_quant(x, w, x, w, 1.0, 128)
    ops.rmsnorm(x, w, 1.0)
    launches = device.launches
    for call in (lambda: ops.per_token_group_quant_fp8(x, 128.0),
                 lambda: ops.rmsnorm_group_quant(x, w, 1.0, 128.0),
                 lambda: ops.dual_rmsnorm_group_quant(x, w, x, w, 1.0, 128.0)):
        with pytest.raises(TypeError, match="group_size: expected an int"):
            call()
    for call in (lambda: ops.rmsnorm(x, w, True), lambda: ops.rmsnorm_group_quant(x, w, True),
                 lambda: ops.dual_rmsnorm_group_quant(x, w, x, w, True)):
        with pytest.raises(TypeError, match="eps: expected a float"):
            call()
    assert device.launches == launches


def test_ops_on_an_arch_without_kernels_are_unsupported(device):
    from codegen.dispatch import Unsupported

    device.arch = "sm_80"
    x, w = rows(4, 256), rows(1, 256)[0]
    with pytest.raises(Unsupported, match="q: device arch"):
        ops.dual_rmsnorm_group_quant(x, w, x, w)
    with pytest.raises(Unsupported, match="x: device arch"):
        ops.rmsnorm_group_quant(x, w)
    device.arch = "gfx90a"                 # RMSNorm's, but no FP8
    _common.attach_emulated(device)
    a = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(Unsupported, match="x: arch gfx90a has no FP8"):
        ops.per_token_group_quant_fp8(x)
    with pytest.raises(Unsupported, match="a: arch gfx90a has no FP8"):
        ops.gemm_a8w8_blockscale(a, torch.ones(4, 2), a, torch.ones(1, 2))
    assert device.launches == 0
    ops.rmsnorm(x, w)
    assert device.launches == 1


def test_gemm_launches_with_each_calls_strides_and_k(device):
    """What a kept plan holds for a signature reaches the launch with that call's strides: a's
    rows and both scales' layouts; K that is not a multiple of 16 arrives padded, in a copy."""
    fp8 = torch.float8_e4m3fn
    b, b_s = torch.zeros(256, 256, dtype=fp8), torch.ones(2, 2)
    pitched = torch.zeros(4, 272, dtype=fp8)[:, :256]
    for a, a_s in ((pitched.contiguous(), torch.ones(4, 2)),
                   (pitched.contiguous(), torch.ones(2, 4).t()),
                   (pitched, torch.ones(4, 2)),
                   (pitched.contiguous(), torch.ones(2, 4).t())):
        ops.gemm_a8w8_blockscale(a, a_s, b, b_s)
        args = device.args[-1]
        assert args[0] == a.data_ptr() and args[5:14] == (4, 256, 256, a.stride(0), 256,
                                                          *a_s.stride(), *b_s.stride())
    for k, padded in ((24, 32), (100, 112), (3884, 3888)):
        a, b = torch.zeros(4, k, dtype=fp8), torch.zeros(8, k, dtype=fp8)
        kb = -(-k // 128)
        ops.gemm_a8w8_blockscale(a, torch.ones(4, kb), b, torch.ones(1, kb))
        args = device.args[-1]
        assert args[5:10] == (4, 8, padded, padded, padded), k
        assert args[0] % 16 == 0 and args[0] != a.data_ptr() and args[1] != b.data_ptr()


def test_each_call_gets_the_kernel_of_its_flags_and_rows(device):
    """Plans keep kernels per signature; what the signature leaves open picks among them:
    ue8m0 for the fused quant ops, and 16-byte or scalar access by every row's alignment."""
    x, w = rows(4, 256), rows(1, 256)[0]
    for ue8m0 in (False, True, False):
        ops.rmsnorm_group_quant(x, w, ue8m0=ue8m0)
        ops.dual_rmsnorm_group_quant(x, w, x, w, ue8m0=ue8m0)
        ops.per_token_group_quant_fp8(x, ue8m0=ue8m0)
        assert [v["ue8m0"] for v in device.launched[-3:]] == [ue8m0] * 3
    odd = torch.zeros(4 * 256 + 1, dtype=BF)[1:].view(4, 256)     # rows 2 bytes off
    for call, load in ((lambda: ops.rmsnorm(x, w), "vec16"),
                       (lambda: ops.rmsnorm(rows(1, 101), rows(1, 101)[0]), "scalar"),
                       (lambda: ops.rmsnorm(x, w, out=odd), "scalar"),
                       (lambda: ops.fused_add_rmsnorm(x, rows(4, 256), w, residual_out=odd),
                        "scalar"),
                       (lambda: ops.fused_add_rmsnorm(x, rows(4, 256), w), "vec16")):
        call()
        assert device.launched[-1]["load"] == load


def test_rows_off_16_byte_boundaries_reach_the_quant_kernels_copied(device):
    """The quant kernels load rows 16 bytes at a time: an input whose rows start elsewhere is
    launched as an aligned copy (x, weights, a residual that is only read)."""
    w = rows(1, 256)[0]
    odd = torch.zeros(4 * 256 + 1, dtype=BF)[1:].view(4, 256)
    odd_w = torch.zeros(257, dtype=BF)[1:]
    ops.per_token_group_quant_fp8(odd)
    assert device.args[-1][0] % 16 == 0
    ops.rmsnorm_group_quant(odd, odd_w)
    assert device.args[-1][0] % 16 == 0 and device.args[-1][3] % 16 == 0
    ops.rmsnorm_group_quant(rows(4, 256), w, residual=odd, residual_out=rows(4, 256))
    assert device.args[-1][1] % 16 == 0
    ops.dual_rmsnorm_group_quant(odd, odd_w, odd, odd_w)
    assert all(device.args[-1][i] % 16 == 0 for i in (0, 1, 4, 5))


def test_gfx942_quant_takes_each_calls_fp8_max(device):
    device.arch = "gfx942"
    x = rows(4, 256)
    for fp8_max, token in ((None, "e4m3fnuz224"), (240.0, "e4m3fnuz240"), (None, "e4m3fnuz224")):
        q, _ = ops.per_token_group_quant_fp8(x, fp8_max=fp8_max)
        assert q.dtype == torch.float8_e4m3fnuz and device.launched[-1]["fp8"] == token


def test_compiled_calls_take_the_identities_the_ops_allow(cpu_impls):
    import torch._dynamo

    torch._dynamo.reset()
    w, x, r = rows(1, 256)[0], rows(4, 256), rows(4, 256)
    torch.compile(lambda x, r: ops.fused_add_rmsnorm(x, r, w, out=x, residual_out=r),
                  fullgraph=True, backend="aot_eager")(x, r)


def test_operands_a_kernel_would_read_or_write_past_are_refused(device):
    """Shapes, dtypes and row alignment that would send a kernel past a buffer, each refused by
    name, also after a good call of the same signature left its plan."""
    x, w = rows(4, 256), rows(1, 256)[0]
    fp8 = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    a, a_s, b_s = fp8[:4].clone(), torch.ones(4, 2), torch.ones(2, 2)
    ops.gemm_a8w8_blockscale(a, a_s, fp8, b_s)
    ops.rmsnorm(x, w, out=torch.empty_like(x))
    buf = torch.zeros(4 * 256 + 16, dtype=torch.float8_e4m3fn)
    pitch_264 = torch.zeros(256 * 264, dtype=torch.float8_e4m3fn).as_strided((256, 256), (264, 1))
    shared = torch.zeros(7 * 256, dtype=BF)
    cases = [
        (lambda: ops.rmsnorm(x, w, out=torch.empty(4, 128, dtype=BF)), "out: .* expected"),
        (lambda: ops.rmsnorm(x, w, out=torch.empty(4, 256, dtype=torch.float16)),
         "out: .* expected"),
        (lambda: ops.fused_add_rmsnorm(x, x.clone(), w, out=torch.empty(4, 128, dtype=BF)),
         "out: .* expected"),
        (lambda: ops.gemm_a8w8_blockscale(a, torch.ones(3, 2), fp8, b_s), "a_scales: shape"),
        (lambda: ops.gemm_a8w8_blockscale(a, a_s, fp8, torch.ones(1, 2)), "b_scales: shape"),
        (lambda: ops.gemm_a8w8_blockscale(buf[8:8 + 1024].view(4, 256), a_s, fp8, b_s),
         "a: rows must start on 16-byte boundaries"),
        (lambda: ops.gemm_a8w8_blockscale(a, a_s, pitch_264, b_s),
         "b: rows must start on 16-byte boundaries"),
        (lambda: ops.gemm_a8w8_blockscale(a, a_s, fp8.view(torch.float8_e5m2), b_s), "b: dtype"),
        # one row shared, the last of one and the first of the other
        (lambda: ops.fused_add_rmsnorm(shared[:1024].view(4, 256),
                                       shared[768:1792].view(4, 256), w), "residual: overlaps x"),
        (lambda: ops.fused_add_rmsnorm(shared[768:1792].view(4, 256),
                                       shared[:1024].view(4, 256), w), "residual: overlaps x"),
    ]
    for call, message in cases:
        with pytest.raises((TypeError, ValueError), match=message):
            call()
    assert device.launches == 2


def test_vllm_quant_takes_its_flags_and_keeps_the_callers_shape(device):
    x = rows(6, 256)
    q, s = vllm.per_token_group_quant_fp8(x, 128, column_major_scales=True,
                                          tma_aligned_scales=True, use_ue8m0=True)
    v = device.launched[-1]
    assert v["ue8m0"] is True and v["scale_layout"] == "col_tma" and v["group_size"] == 128
    assert s.shape == (6, 2) and s.stride() == (1, 8)               # round_up(6, 4)
    q, s = vllm.per_token_group_quant_fp8(x.view(2, 3, 256), 64)
    v = device.launched[-1]
    assert v["ue8m0"] is False and v["scale_layout"] == "row" and v["group_size"] == 64
    assert q.shape == (2, 3, 256) and s.shape == (2, 3, 4)


def test_rmsnorm_module_launches_with_its_residual_and_the_inputs_dtype(device):
    x, r = rows(4, 256), rows(4, 256)
    y, out_r = cnn.RMSNorm(256, quantize=True).to(BF)(x, r)
    v = device.launched[-1]
    assert v.family == "rmsnorm_group_quant" and v["residual"] is True and out_r is r
    cnn.RMSNorm(256).to(BF)(x.half())                  # its weight cast to the input's dtype
    assert device.launched[-1].family == "rmsnorm" and device.launched[-1]["dtype"] == "fp16"


def test_aiter_fused_quant_takes_one_launch_only_where_the_mla_kernel_does_it_all(device):
    from codegen import aiter

    x, w, kv, kv_w = rows(4, 1536), rows(1, 1536)[0], rows(4, 512), rows(1, 512)[0]

    def families(**kw):
        n = len(device.launched)
        outs = aiter.fused_rms_fp8_group_quant(x, w, 1e-6, kv, kv_w, kw.pop("eps2", 1e-6), **kw)
        return [v.family for v in device.launched[n:]], outs
    assert families()[0] == ["dual_rmsnorm_group_quant"]
    assert families(eps2=1e-5)[0] == ["rmsnorm_group_quant", "rmsnorm"]
    launched, outs = families(output_unquantized_inp1=True)
    assert launched == ["rmsnorm_group_quant", "rmsnorm"] and outs[1] is not None
    launched, outs = families(res1=rows(4, 1536))
    assert launched == ["rmsnorm_group_quant", "rmsnorm"] and outs[3] is not None
    kv, kv_w = rows(4, 516), rows(1, 516)[0]                    # kv rows the MLA kernel lacks
    assert families()[0] == ["rmsnorm_group_quant", "rmsnorm"]


def test_compiled_quant_writes_into_out(cpu_impls, monkeypatch):
    """Under torch.compile the registered op returns a new q: the caller's out= is written."""
    import ctypes

    import torch._dynamo

    def kernel(variant):
        def launch(x, q, s, groups_total, *rest):
            ctypes.memset(q, 0x38, groups_total * variant["group_size"])    # 1.0 in e4m3fn
            return 0
        return launch
    monkeypatch.setattr(cpu_impls, "kernel", kernel)
    torch._dynamo.reset()
    out = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
    torch.compile(lambda x: ops.per_token_group_quant_fp8(x, out=out), fullgraph=True,
                  backend="eager")(rows(4, 256))
    assert (out.view(torch.uint8) == 0x38).all()


def test_fake_outputs_are_the_real_ones_in_shape_dtype_and_strides(cpu_impls):
    """torch.compile plans with the registered fakes: the scales in each layout, rgq's y only
    where it is asked for, and the dual op's three outputs as the kernels' real ones."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fp8, cg = torch.float8_e4m3fn, torch.ops.codegen
    calls = []
    for layout in ("row", "col", "col_tma"):
        calls += [lambda x, w, lay=layout: cg.per_token_group_quant_fp8(x, 128, lay, False,
                                                                        448.0, fp8),
                  lambda x, w, lay=layout: cg.dual_rmsnorm_group_quant(x, w, x, w, 1e-6, 128,
                                                                       lay, False, 448.0, fp8)]
        calls += [lambda x, w, lay=layout, y=y: cg.rmsnorm_group_quant(x, w, None, 1e-6, 128, lay,
                                                                       False, y, 448.0, fp8)
                  for y in (False, True)]
    x, w = rows(6, 256), rows(1, 256)[0]
    mode = FakeTensorMode()
    fake_x, fake_w = mode.from_tensor(x), mode.from_tensor(w)
    for call in calls:
        real = call(x, w)
        with mode:
            fake = call(fake_x, fake_w)
        assert [(t.shape, t.dtype, t.stride()) for t in fake] == \
            [(t.shape, t.dtype, t.stride()) for t in real]
