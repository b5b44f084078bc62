"""The C++ eager path (codegen/csrc/fastcall.cpp) passes the launchers exactly what the Python
path passes, allocates the same outputs, and declines (None) every call its plan does not cover.

On the CPU: the launchers are recorders (a small C library built here) behind a stand-in
device, the Python path runs through the emulated-device hook, and the C++ path through plans
recorded by hand for the same calls.
"""
import ctypes
import shutil
import subprocess

import pytest
import torch

from codegen import ops
from codegen.families import get as family
from codegen.ops import _common, _fast

RECORDERS = r"""
#include <stdint.h>
int64_t last[16];
float last_eps;
#define P(i) last[i] = (int64_t)a##i
int rec_quant(void* a0, void* a1, void* a2, int64_t a3, int64_t a4, int64_t a5, int64_t a6,
              int64_t a7, void* a8) { P(0); P(1); P(2); P(3); P(4); P(5); P(6); P(7); P(8); return 0; }
int rec_norm(void* a0, void* a1, void* a2, void* a3, void* a4, int64_t a5, int64_t a6,
             int64_t a7, int64_t a8, int64_t a9, float e, void* a10) {
  P(0); P(1); P(2); P(3); P(4); P(5); P(6); P(7); P(8); P(9); P(10); last_eps = e; return 0; }
int rec_norm_quant(void* a0, void* a1, void* a2, void* a3, void* a4, void* a5, void* a6,
                   int64_t a7, int64_t a8, int64_t a9, int64_t a10, int64_t a11, int64_t a12,
                   int64_t a13, float e, void* a14) {
  P(0); P(1); P(2); P(3); P(4); P(5); P(6); P(7); P(8); P(9); P(10); P(11); P(12); P(13);
  P(14); last_eps = e; return 0; }
int rec_dual(void* a0, void* a1, void* a2, void* a3, void* a4, void* a5, void* a6, int64_t a7,
             int64_t a8, int64_t a9, int64_t a10, int64_t a11, int64_t a12, int64_t a13,
             float e, void* a14) {
  P(0); P(1); P(2); P(3); P(4); P(5); P(6); P(7); P(8); P(9); P(10); P(11); P(12); P(13);
  P(14); last_eps = e; return 0; }
int rec_gemm(void* a0, void* a1, void* a2, void* a3, void* a4, int64_t a5, int64_t a6,
             int64_t a7, int64_t a8, int64_t a9, int64_t a10, int64_t a11, int64_t a12,
             int64_t a13, void* a14) {
  P(0); P(1); P(2); P(3); P(4); P(5); P(6); P(7); P(8); P(9); P(10); P(11); P(12); P(13);
  P(14); return 0; }
"""
QUANT_WAVES = family("group_quant_fp8").GRID_WAVES   # what the Python path passes
FAMILIES = {"group_quant_fp8": "rec_quant", "rmsnorm": "rec_norm",
            "rmsnorm_group_quant": "rec_norm_quant", "gemm_a8w8_blockscale": "rec_gemm",
            "dual_rmsnorm_group_quant": "rec_dual"}


@pytest.fixture(scope="module")
def fast():
    mod = _fast.module(wait=True)
    if mod is None:
        pytest.skip("the C++ path could not be built here")
    return mod


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("rec")
    (d / "rec.c").write_text(RECORDERS)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", str(d / "rec.c"), "-o", str(d / "rec.so")],
                   check=True)
    return ctypes.CDLL(str(d / "rec.so"))


class Recording:
    """A stand-in device whose every launcher records its arguments."""
    arch = "sm_90a"
    multiprocessors = 132

    def __init__(self, lib):
        self.lib = lib

    def kernel(self, variant):
        fn = getattr(self.lib, FAMILIES[variant.family])
        fn.argtypes = family(variant.family).ARGTYPES
        fn.restype = ctypes.c_int
        return fn

    def last(self, n):
        return list((ctypes.c_int64 * 16).in_dll(self.lib, "last")[:n])

    def eps(self, mark: float | None = None) -> float:
        """The last launch's eps (the norms'); mark: then set it to a value no launch passes."""
        cell = ctypes.c_float.in_dll(self.lib, "last_eps")
        value = cell.value
        if mark is not None:
            cell.value = mark
        return value


@pytest.fixture
def device(lib, fast):
    dev = Recording(lib)
    _common.attach_emulated(dev)
    yield dev
    _common.attach_emulated(None)


def _addr(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _same_output(a, b):
    assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)


def _carved(outs):
    """The C++ path's outputs: one storage, each 256-byte aligned, apart, and inside it."""
    storage = outs[0].untyped_storage()
    spans = []
    for t in outs:
        assert t.untyped_storage().data_ptr() == storage.data_ptr()
        start = t.data_ptr() - storage.data_ptr()
        span = 0 if t.numel() == 0 else t.element_size() * (
            1 + sum((d - 1) * st for d, st in zip(t.shape, t.stride())))
        assert start % 256 == 0 and start + span <= storage.nbytes()
        spans.append((start, start + span))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def python_path(run):
    """run() with the ops' C++ path declining every call (the ops would otherwise take the plans
    recorded here)."""
    call = _fast.call
    _fast.call = lambda *args: None
    try:
        return run()
    finally:
        _fast.call = call


def _compare(dev, n, run_python, run_fast, out_slots):
    """Both paths' outputs have one shape, strides and dtype, and their launches the same
    arguments (eps too) but the output pointers (each path's own outputs')."""
    dev.eps(-1.0)
    py = python_path(run_python)
    py_args, py_eps = dev.last(n), dev.eps(-1.0)
    fa = run_fast()
    fa_args = dev.last(n)
    assert dev.eps() == py_eps
    py, fa = (py if isinstance(py, tuple) else (py,)), (fa if isinstance(fa, tuple) else (fa,))
    for a, b in zip(py, fa):
        _same_output(a, b)
    _carved(fa)
    for slot, t in zip(out_slots, fa):
        assert fa_args[slot] == t.data_ptr()
        py_args[slot] = fa_args[slot]
    assert py_args == fa_args


@pytest.mark.parametrize("layout", ["row", "col", "col_tma"])
@pytest.mark.parametrize("t,h", [(0, 256), (3, 0)])
def test_quant_empty_outputs_have_torchs_strides(device, fast, lib, layout, t, h):
    x = torch.randn(t, h).to(torch.bfloat16)
    pid = _fast.param_id((128, layout, False, None, None))
    fast.record(_fast.QUANT, pid, (x,), _addr(lib, "rec_quant"), "u", torch.float8_e4m3fn,
                (h // 128, _fast.LAYOUTS[layout], QUANT_WAVES), 0.0)
    for a, b in zip(python_path(lambda: ops.per_token_group_quant_fp8(x, scale_layout=layout)),
                    fast.quant(pid, x, None)):
        _same_output(a, b)


@pytest.mark.parametrize("layout", ["row", "col", "col_tma"])
@pytest.mark.parametrize("t", [1, 5])
def test_quant(device, fast, lib, layout, t):
    x = torch.randn(t, 256).to(torch.bfloat16)
    pid = _fast.param_id((128, layout, False, None, None))
    fast.record(_fast.QUANT, pid, (x,), _addr(lib, "rec_quant"), "u", torch.float8_e4m3fn,
                (2, _fast.LAYOUTS[layout], QUANT_WAVES), 0.0)
    _compare(device, 9, lambda: ops.per_token_group_quant_fp8(x, scale_layout=layout),
             lambda: fast.quant(pid, x, None), (1, 2))
    # out: q lands there, the scales are the call's own; an out the Python path would refuse
    # (another shape or dtype, strided, off 16 bytes) is declined, so that it says why
    out = torch.empty(t, 256, dtype=torch.float8_e4m3fn)
    q, s = fast.quant(pid, x, out)
    assert q is out and device.last(3)[1:] == [out.data_ptr(), s.data_ptr()]
    _same_output(s, python_path(lambda: ops.per_token_group_quant_fp8(x, scale_layout=layout))[1])
    shifted = torch.empty(t * 256 + 1, dtype=out.dtype)[1:].view(t, 256)
    x_as_fp8 = torch.empty(0, dtype=out.dtype).set_(x.untyped_storage(), 0, x.shape, x.stride())
    for bad in (torch.empty(t, 128, dtype=out.dtype), torch.empty_like(x),
                torch.empty(t, 512, dtype=out.dtype)[:, ::2], shifted, x_as_fp8, "out"):
        assert fast.quant(pid, x, bad) is None


def test_quant_rows_off_16_byte_boundaries_take_the_python_path(device, fast, lib):
    x = torch.randn(5, 260).to(torch.bfloat16)[:, 4:]      # 8 bytes in, rows 520 bytes apart
    pid = _fast.param_id((128, "row", False, None, None))
    fast.record(_fast.QUANT, pid, (x,), _addr(lib, "rec_quant"), "u", torch.float8_e4m3fn,
                (2, _fast.LAYOUTS["row"], QUANT_WAVES), 0.0)
    assert fast.quant(pid, x, None) is None


@pytest.mark.parametrize("residual", ["none", "in_place", "out"])
def test_norm(device, fast, lib, residual):
    bf = torch.bfloat16
    x, w = torch.randn(6, 512).to(bf), torch.randn(512).to(bf)
    r = torch.randn(6, 512).to(bf) if residual != "none" else None
    ro = torch.empty(6, 1024, dtype=bf)[:, 512:] if residual == "out" else None   # strided rows
    name = "fused_add_rmsnorm" if r is not None else "rmsnorm"
    pid = _fast.param_id((name, 1e-6))
    fast.record(_fast.NORM, pid, (x, r, w, ro), _addr(lib, "rec_norm"), "u", x.dtype, (), 1e-6)
    run = (lambda: ops.fused_add_rmsnorm(x, r, w, residual_out=ro)) if r is not None else (
        lambda: ops.rmsnorm(x, w))
    _compare(device, 11, run, lambda: fast.norm(pid, x, r, w, ro, None), (4,))
    if ro is not None:
        assert device.last(10)[2] == ro.data_ptr() and device.last(10)[9] == 2048
    y = torch.empty_like(x)
    assert fast.norm(pid, x, r, w, ro, y) is y and device.last(5)[4] == y.data_ptr()
    assert fast.norm(pid, x, r, w, ro, torch.empty(6, 256, dtype=x.dtype)) is None  # not x's shape
    # a row start off 16 bytes, a residual of other rows: the Python path's calls
    shifted = torch.empty(6 * 512 + 1, dtype=x.dtype)[1:].view(6, 512)
    assert fast.norm(pid, shifted, r, w, ro, None) is None
    assert fast.norm(pid, x, r, torch.randn(256).to(x.dtype), ro, None) is None  # another length
    if ro is not None:
        assert fast.norm(pid, x, r, w, ro[:4], None) is None
        assert fast.norm(pid, x, r, w, None, None) is None     # in place: another plan
        # sharing memory with another operand: the Python path's error
        assert fast.norm(pid, x, r, w, ro, ro.as_strided(x.shape, x.stride())) is None
        big = torch.empty(6 * 1024, dtype=bf)        # r's and ro's signatures, one memory
        assert fast.norm(pid, x, big[:3072].view(6, 512), w, big.view(6, 1024)[:, :512],
                         None) is None
    # what the Python path refuses: out over x (but not x itself) or over the weight, the sum
    # written over x or the weight, out over the residual
    assert fast.norm(pid, x, r, w, ro, x) is not None
    buf = torch.empty(7 * 512, dtype=bf)
    x_over = buf[512:].view(6, 512)
    assert fast.norm(pid, x_over, r, w, ro, buf[:3072].view(6, 512)) is None
    assert fast.norm(pid, x, r, y[0], ro, y) is None
    if r is not None:
        assert fast.norm(pid, x, r[:4], w, ro, None) is None
        assert fast.norm(pid, x, r, w, ro, r) is None
        if ro is None:
            assert fast.norm(pid, x_over, buf[:3072].view(6, 512), w, None, None) is None
            assert fast.norm(pid, x, r, r[1], None, None) is None
    else:
        assert fast.norm(pid, x[1:], r, w, ro, None).shape == (5, 512)  # any row count, one plan


def test_norm_columns_of_one_buffer_side_by_side(device, fast, lib):
    """x and the residual it adds to, side by side in the rows of one buffer: apart."""
    bf = torch.bfloat16
    wide, w = torch.randn(6, 1024).to(bf), torch.randn(512).to(bf)
    x, r = wide[:, :512], wide[:, 512:]
    pid = _fast.param_id(("fused_add_rmsnorm", 1e-6))
    fast.record(_fast.NORM, pid, (x, r, w, None), _addr(lib, "rec_norm"), "u", x.dtype, (), 1e-6)
    _compare(device, 11, lambda: ops.fused_add_rmsnorm(x, r, w),
             lambda: fast.norm(pid, x, r, w, None, None), (4,))
    assert fast.norm(pid, wide[:, 8:520], r, w, None, None) is None     # now they overlap


@pytest.mark.parametrize("layout,residual", [("row", "none"), ("col_tma", "none"),
                                              ("row", "in_place"), ("row", "out")])
def test_norm_quant(device, fast, lib, layout, residual):
    bf = torch.bfloat16
    x, w = torch.randn(3, 256).to(bf), torch.randn(256).to(bf)
    r = torch.randn(3, 256).to(bf) if residual != "none" else None
    ro = torch.empty(3, 256, dtype=bf) if residual == "out" else None
    pid = _fast.param_id(("rmsnorm_group_quant", 1e-6, 128, layout, False, None))
    fast.record(_fast.NORM_QUANT, pid, (x, w, r, ro), _addr(lib, "rec_norm_quant"), "u",
                torch.float8_e4m3fn, (2, _fast.LAYOUTS[layout], 0), 1e-6)
    _compare(device, 15, lambda: ops.rmsnorm_group_quant(x, w, scale_layout=layout, residual=r,
                                                         residual_out=ro),
             lambda: fast.norm_quant(pid, x, w, r, ro), (4, 5))
    if ro is not None:
        assert device.last(3)[2] == ro.data_ptr()


def test_dual(device, fast, lib):
    bf = torch.bfloat16
    q, kv = torch.randn(4, 1536).to(bf), torch.randn(4, 512).to(bf)
    qw, kw = torch.randn(1536).to(bf), torch.randn(512).to(bf)
    pid = _fast.param_id(("dual", 1e-6, 128, "col", False, None))
    fast.record(_fast.DUAL, pid, (q, qw, kv, kw), _addr(lib, "rec_dual"), "u",
                torch.float8_e4m3fn, (12, _fast.LAYOUTS["col"], 0), 1e-6)
    _compare(device, 15, lambda: ops.dual_rmsnorm_group_quant(q, qw, kv, kw, scale_layout="col"),
             lambda: fast.dual(pid, q, qw, kv, kw), (2, 3, 6))
    assert fast.dual(pid, q, qw, kv[:3], kw) is None
    assert fast.dual(pid, q, qw, kv, kw[:256]) is None


def test_gemm(device, fast, lib):
    fp8 = torch.float8_e4m3fn
    a, b = torch.zeros(3, 256, dtype=fp8), torch.zeros(200, 256, dtype=fp8)
    sa, sb = torch.ones(2, 3).t(), torch.ones(2, 2)
    ops.gemm_a8w8_blockscale(a, sa, b, sb)       # picks and checks the kernel
    py_args = device.last(15)
    fast.record(_fast.GEMM, 0, (a, sa, b, sb), _addr(lib, "rec_gemm"), "u", torch.bfloat16,
                tuple(py_args[5:14]), 0.0)
    _compare(device, 15, lambda: ops.gemm_a8w8_blockscale(a, sa, b, sb),
             lambda: fast.gemm(0, a, sa, b, sb), (4,))
    assert fast.gemm(0, a[:2], sa[:2], b, sb) is None      # another M: another plan


def test_the_plans_the_ops_keep_launch_as_their_python_calls(device, fast, lib, monkeypatch):
    """Each op's first eager call keeps a plan (here as on a GPU: the stand-in's tensors are let
    through) and its second takes the C++ path with it: the same launch arguments but the
    outputs', at G = 64 and in each scale layout (the ints the plan keeps per op)."""
    monkeypatch.setattr(_fast, "on_emulator", lambda t: False)
    taken = []
    call = _fast.call
    monkeypatch.setattr(_fast, "call", lambda *a: taken.append(call(*a)) or taken[-1])
    bf, fp8 = torch.bfloat16, torch.float8_e4m3fn
    x, w, r = torch.randn(5, 512).to(bf), torch.randn(512).to(bf), torch.randn(5, 512).to(bf)
    kv, kw = torch.randn(5, 256).to(bf), torch.randn(256).to(bf)
    a, b = torch.zeros(3, 256, dtype=fp8), torch.zeros(200, 256, dtype=fp8)
    sa, sb = torch.ones(2, 3).t(), torch.ones(2, 2)
    cases = [(lambda: ops.rmsnorm(x, w), 11, (4,)),
             (lambda: ops.fused_add_rmsnorm(x, r, w), 11, (4,)),
             (lambda: ops.gemm_a8w8_blockscale(a, sa, b, sb), 15, (4,))]
    for layout in ("row", "col", "col_tma"):
        cases += [(lambda lay=layout: ops.per_token_group_quant_fp8(x, 64, scale_layout=lay), 9,
                   (1, 2)),
                  (lambda lay=layout: ops.rmsnorm_group_quant(x, w, 1e-6, 64, scale_layout=lay),
                   15, (4, 5)),
                  (lambda lay=layout: ops.dual_rmsnorm_group_quant(x, w, kv, kw, 1e-6, 64,
                                                                   scale_layout=lay), 15,
                   (2, 3, 6))]
    for run, n, out_slots in cases:
        device.eps(-1.0)
        first = run()
        first_args, first_eps = device.last(n), device.eps(-1.0)
        del taken[:]
        second = run()
        assert taken and taken[-1] is not None, "the second call took the Python path"
        second_args = device.last(n)
        assert device.eps() == first_eps
        first, second = (t if isinstance(t, tuple) else (t,) for t in (first, second))
        for slot, t in zip(out_slots, second):
            assert second_args[slot] == t.data_ptr()
            first_args[slot] = t.data_ptr()
        assert first_args == second_args
        for one, other in zip(first, second):
            _same_output(one, other)


def test_no_plan_no_call(fast):
    x = torch.randn(2, 384).to(torch.bfloat16)
    assert fast.quant(_fast.param_id(("never", "recorded")), x, None) is None
    assert fast.quant(_fast.param_id(("never", "recorded")), "not a tensor", None) is None


def test_first_call_does_not_wait_for_the_build(monkeypatch):
    """module() starts the build and answers None at once (the caller takes the Python path);
    module(wait=True) waits for it; once built, every call gets the module. The calls made
    meanwhile start no second build."""
    import threading

    release, built, builds = threading.Event(), object(), []

    def slow_build():
        builds.append(1)
        assert release.wait(30)
        return built

    monkeypatch.setattr(_fast, "_state", {})
    monkeypatch.setattr(_fast, "MOD", None)
    monkeypatch.setattr(_fast, "_build", slow_build)
    assert _fast.module() is None
    assert _fast.module() is None and _fast._state["thread"].is_alive()
    release.set()
    assert _fast.module(wait=True) is built
    assert _fast.module() is built and _fast.MOD is built
    assert len(builds) == 1


def test_a_build_killed_midway_leaves_no_lock_that_later_processes_wait_on(fast):
    """torch's extension builder locks with a plain file, which a killed build leaves behind;
    the next process must not wait on it forever (at exit, for the builder thread)."""
    import os
    import subprocess
    import sys

    stale = _fast.build_dir() / "lock"
    stale.touch()
    run = subprocess.run([sys.executable, "-c", "from codegen.ops import _fast; "
                          "print(_fast.module(wait=True) is not None)"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0 and run.stdout.strip() == "True", run.stderr[-2000:]
    assert not stale.exists()


def test_the_built_module_launches_on_torchs_current_stream(monkeypatch, tmp_path):
    """The extension asks torch for the current stream at each launch (through the getter it is
    given), so that calls under torch.cuda.stream() or a graph capture go where torch's do."""
    import torch.utils.cpp_extension
    from types import SimpleNamespace

    given = []
    built = SimpleNamespace(set_stream_getter=given.append)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", lambda *a, **k: built)
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(tmp_path))
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0)   # CPU torch: none
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", getter, raising=False)
    assert _fast._build() is built
    assert given == [getter]
