"""codegen.nn, codegen.vllm, codegen.aiter and codegen.supported: what an engine drops in.

CPU: the weight quantization and checkpoint conversion (plain torch), argument errors, the
capability query, imports without a GPU. GPU (L5): each module and entry point against the ops
it is made of, bit for bit, and against bf16 math; torch.compile(fullgraph=True) and CUDA graphs.
"""
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from codegen import nn as cnn
from codegen import aiter, ops, reference, vllm
from codegen.ops.quant import empty_scales
from codegen.support import supported

from .checks import (assert_same, check_aiter_entry_points, check_vllm_entry_points,
                     rel_err)

gpu = pytest.mark.gpu


# ---- CPU ----

@pytest.mark.parametrize("n,k", [(256, 384), (300, 200), (1, 16)])
def test_quantize_weight_blocks(n, k):
    w = torch.randn(n, k) * torch.logspace(-3, 1, n)[:, None]
    q, s = cnn.quantize_weight(w, torch.float8_e4m3fn, 448.0)
    assert q.shape == (n, k) and s.shape == (-(-n // 128), -(-k // 128))
    def per_block(t):        # [ceil(n/128), ceil(k/128), 128 * 128], zero-padded
        pad = torch.zeros(s.shape[0] * 128, s.shape[1] * 128)
        pad[:n, :k] = t
        return pad.view(s.shape[0], 128, s.shape[1], 128).transpose(1, 2).flatten(2)
    deq = q.float() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    amax = per_block(w.abs()).amax(dim=2)
    # each block's own scale: its largest value lands on the FP8 max
    torch.testing.assert_close(amax / s, torch.full_like(s, 448.0))
    # e4m3 keeps 3 mantissa bits: half an ulp of the block's largest value at most
    assert (per_block((deq - w).abs()).amax(dim=2) <= amax / 16).all()


def test_an_all_zero_weight_block_quantizes_to_zeros_not_nan():
    w = torch.zeros(128, 256)
    w[:, 128:] = 1.0
    q, s = cnn.quantize_weight(w, torch.float8_e4m3fn, 448.0)
    assert torch.isfinite(s).all() and s[0, 0] > 0
    assert q[:, :128].float().eq(0).all() and q[:, 128:].float().eq(448).all()


def test_e4m3fn_checkpoint_on_an_fnuz_device_keeps_every_value():
    bits = torch.arange(256, dtype=torch.uint8)
    w = bits.view(torch.float8_e4m3fn).view(2, 128)
    s = torch.tensor([[0.5]])
    q, s2 = cnn.e4m3fn_to_device(w, s, torch.float8_e4m3fnuz)
    assert q.dtype == torch.float8_e4m3fnuz and s2.item() == 1.0
    a, b = w.float() * 0.5, q.float() * 1.0
    finite = torch.isfinite(a)
    assert torch.equal(a[finite], b[finite])          # -0 became +0: equal as values
    assert torch.isnan(b[~finite]).all()              # fn's NaNs (0x7f, 0xff) stay NaN
    same, _ = cnn.e4m3fn_to_device(w, s, torch.float8_e4m3fn)
    assert same is w
    with pytest.raises(TypeError, match="weight: dtype torch.bfloat16"):
        cnn.e4m3fn_to_device(w.float().bfloat16(), s, torch.float8_e4m3fnuz)


def test_bad_arguments_name_the_argument_before_any_gpu_work():
    x = torch.zeros(4, 128)
    with pytest.raises(ValueError, match="eps:"):
        vllm.per_token_group_quant_fp8(x, 128, eps=1e-6)
    # vLLM's row-major scales ignore TMA alignment: the call goes on to the device check
    with pytest.raises(ValueError, match="x: must be on a GPU"):
        vllm.per_token_group_quant_fp8(x, 128, tma_aligned_scales=True)
    with pytest.raises(ValueError, match="input: must be on a GPU"):
        vllm.rms_norm_per_block_quant(x.bfloat16(), x[0].bfloat16(), 1e-6, torch.float8_e4m3fn,
                                      [1, 128], tma_alignment=4)
    with pytest.raises(ValueError, match="input: TMA-aligned scales need 2-D input"):
        vllm.rms_norm_per_block_quant(x.view(2, 2, 128), x[0], 1e-6, torch.float8_e4m3fn,
                                      [1, 128], is_scale_transposed=True, tma_alignment=4)
    with pytest.raises(ValueError, match="column-major scales need 2-D x"):
        vllm.per_token_group_quant_fp8(x.view(2, 2, 128), 128, column_major_scales=True)
    with pytest.raises(ValueError, match="scale_ub"):
        vllm.rms_norm_per_block_quant(x, x[0], 1e-6, torch.float8_e4m3fn, [1, 128],
                                      scale_ub=torch.ones(1))
    with pytest.raises(ValueError, match="group_size"):
        vllm.rms_norm_per_block_quant(x, x[0], 1e-6, torch.float8_e4m3fn, [128, 128])
    with pytest.raises(ValueError, match="block_size"):
        vllm.w8a8_triton_block_scaled_mm(x, x, x, x, [64, 64])
    with pytest.raises(ValueError, match="x: must be on a GPU"):
        vllm.per_token_group_quant_fp8(x, 128)
    # a residual written in place that is no view of rows: an error, not a write to a copy
    res = torch.zeros(2, 128, 2).transpose(1, 2)
    with pytest.raises(ValueError, match="residual: strides"):
        vllm.fused_add_rms_norm(torch.zeros(2, 2, 128), res, None, 1e-6)
    with pytest.raises(ValueError, match="in_features: 100"):
        cnn.BlockFP8Linear(100, 128)
    with pytest.raises(ValueError, match="weight_scale_inv: shape"):
        cnn.BlockFP8Linear.from_fp8(torch.zeros(256, 256, dtype=torch.float8_e4m3fn),
                                    torch.ones(1, 2))


def test_aiter_arguments_the_kernels_lack_are_named_before_any_gpu_work():
    x = torch.zeros(4, 128)
    cases = [
        (lambda: aiter.rms_norm(x, x[0], 1e-6, 1), "use_model_sensitive_rmsnorm"),
        (lambda: aiter.rmsnorm2d_fwd_with_add(x, x, x, x, x[0], 1e-6, True), "gemma_norm"),
        (lambda: aiter.per_group_quant_hip(x, scale=torch.ones(1)), "scale: static"),
        (lambda: aiter.per_group_quant_hip(x, num_rows=torch.ones(1)), "num_rows"),
        (lambda: aiter.per_group_quant_hip(x, scale_type=torch.float16), "scale_type"),
        (lambda: aiter.per_group_quant_hip(x), "quant_dtype: torch.int8"),
        (lambda: aiter.per_group_quant_hip(x, quant_dtype=torch.float8_e4m3fn), "x: must be on"),
        (lambda: aiter.get_hip_quant("per_Token")(x), "quant_type: per_Token"),
        (lambda: aiter.get_hip_quant(aiter.QuantType.per_128x128)(x), "quant_type: per_128x128"),
        (lambda: aiter.gemm_a8w8_blockscale(x, x, x, x, isBpreshuffled=True), "isBpreshuffled"),
        (lambda: aiter.gemm_a8w8_blockscale(x, x, x, x, dtype=torch.float32), "dtype"),
        (lambda: aiter.fused_rms_fp8_group_quant(x, x[0], 1e-6, x), "inp2_weight"),
        (lambda: aiter.fused_rms_fp8_group_quant(x, x[0], 1e-6, dtype_quant=torch.int8),
         "dtype_quant"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=name):
            call()
    # AITER's own conventions: QuantType.No passes through, a type it lacks is NotImplemented
    assert aiter.get_hip_quant(aiter.QuantType.No)(x, quant_dtype=torch.int8) == (x, None)
    with pytest.raises(NotImplementedError, match="quant_type: per_Tensor"):
        aiter.get_hip_quant(aiter.QuantType.per_Tensor)(x)


def test_residual_out_errors_name_the_argument():
    """residual_out's checks, before any launch (a stand-in device that launches nothing)."""
    from codegen.ops import _common

    class NoLaunches:
        arch = "gfx942"

        def kernel(self, variant):
            raise AssertionError(f"launched {variant.uri}")

    x, w = torch.zeros(4, 256, dtype=torch.bfloat16), torch.ones(256, dtype=torch.bfloat16)
    r, y, rr = torch.zeros_like(x), torch.zeros_like(x), torch.zeros(4, 264, dtype=x.dtype)
    cases = [
        (lambda: ops.fused_add_rmsnorm(x, r, w, residual_out=r[:2]), ValueError,
         "residual_out: shape"),
        (lambda: ops.fused_add_rmsnorm(x, r, w, residual_out=r.half()), TypeError,
         "residual_out: dtype"),
        (lambda: ops.fused_add_rmsnorm(x, r, w, residual_out=r.t()), ValueError,
         "residual_out: last dim must be contiguous"),
        (lambda: aiter.rmsnorm2d_fwd_with_add(x, x, r, r[:2], w, 1e-6), ValueError,
         "residual_out: shape"),
        (lambda: ops.rmsnorm_group_quant(x, w, residual_out=r), ValueError,
         "residual_out: given without residual"),
        (lambda: ops.rmsnorm_group_quant(x, w, residual=r, residual_out=r[:, :128]), ValueError,
         "residual_out: shape"),
        (lambda: ops.rmsnorm_group_quant(
            x, w, residual=r, residual_out=torch.zeros(4, 264, dtype=x.dtype)[:, 1:257]),
         ValueError, "residual_out: rows must start on 16-byte"),
        # memory shared with another operand, unless it is the residual itself
        (lambda: ops.fused_add_rmsnorm(x, r, w, residual_out=x), ValueError,
         "residual_out: overlaps x"),
        (lambda: ops.fused_add_rmsnorm(x, rr[:, :256], w, residual_out=rr[:, 8:264]), ValueError,
         "residual_out: overlaps residual"),
        (lambda: ops.fused_add_rmsnorm(x, r, w, out=y, residual_out=y), ValueError,
         "out: overlaps residual_out"),
        (lambda: ops.rmsnorm_group_quant(x, w, residual=r, residual_out=x), ValueError,
         "residual_out: overlaps x"),
    ]
    _common.attach_emulated(NoLaunches())
    try:
        for call, error, message in cases:
            with pytest.raises(error, match=message):
                call()
    finally:
        _common.attach_emulated(None)


@pytest.mark.parametrize("t", [1, 5, 8])
def test_aiter_scales_are_the_column_major_buffer_behind_a_contiguous_view(t):
    """transpose_scale: AITER's [T, G] tensor whose storage is column-major, the layout its
    GEMMs with column-major x_scale read (in vLLM's test: s.t().contiguous().view_as(s))."""
    g = 3
    rows = torch.arange(t * g, dtype=torch.float32).view(t, g)
    col = empty_scales(t, g, "col", rows)
    col.copy_(rows)
    s = aiter.aiter_scales(col, transpose_scale=True)
    assert s.shape == (t, g) and s.is_contiguous()
    assert s.data_ptr() == col.data_ptr()                        # a view: nothing copied
    assert torch.equal(s, rows.t().contiguous().view(t, g))
    assert torch.equal(s.view(-1), torch.tensor([rows[i, j] for j in range(g) for i in range(t)]))
    assert aiter.aiter_scales(col, True, strided=True) is col
    assert aiter.aiter_scales(rows, False) is rows


def test_supported_answers_for_arch_names_and_without_a_gpu():
    s = supported("sm_90a")
    assert s.arch == "sm_90a" and set(s.why_not) >= {"gemm_a8w8_blockscale", "nn.BlockFP8Linear"}
    s = supported("gfx1100")
    assert "FP8" in s.why_not["gemm_a8w8_blockscale"] and "FP8" in s.why_not["nn.BlockFP8Linear"]
    assert not s["per_token_group_quant_fp8"]
    assert "gemm_a8w8_blockscale" not in s and "gfx1100" in str(s)
    from codegen.support import Support

    s = Support("dev", "gfx942", {"rmsnorm": None, "gemm_a8w8_blockscale": "no toolchain"})
    assert "rmsnorm" in s and "gemm_a8w8_blockscale" not in s and "nope" not in s
    assert str(s).splitlines()[1:] == ["  rmsnorm" + " " * 22 + "yes",
                                       "  gemm_a8w8_blockscale" + " " * 9 + "no: no toolchain"]
    s = supported("gfx9999")
    assert s.arch is None and all("unknown arch 'gfx9999'" in r for r in s.why_not.values())
    if not torch.cuda.is_available():
        s = supported()
        assert s.arch is None and not s.runs() and str(s).startswith("the current GPU")
        assert all("no GPU" in r for r in s.why_not.values())
        assert str(supported(0)).startswith("cuda:0")
        with pytest.raises(ValueError, match="device: BlockFP8Linear needs a GPU"):
            cnn.BlockFP8Linear.from_linear(nn.Linear(256, 256))
        with pytest.raises(ValueError, match="device: BlockFP8Linear needs a GPU"):
            cnn.BlockFP8Linear(256, 256)


def test_the_entry_points_are_attributes_of_the_package():
    import codegen

    assert codegen.aiter is aiter and codegen.vllm is vllm and codegen.ops is ops
    assert aiter.QuantType.per_1x128 == 4


def test_rmsnorm_from_module_takes_eps_and_size_as_the_source_means_them():
    """torch.nn.RMSNorm's eps=None is fp32's machine epsilon, an eps of 0 stays 0, a
    Hugging Face style .variance_epsilon is read, and what RMSNorm cannot do is refused."""
    w = torch.randn(256, dtype=torch.bfloat16)
    src = nn.RMSNorm(256, eps=None, dtype=torch.bfloat16)
    src.weight.data.copy_(w)
    layer = cnn.RMSNorm.from_module(src)
    assert layer.eps == torch.finfo(torch.float32).eps and layer.hidden_size == 256
    assert layer.weight.dtype == torch.bfloat16 and torch.equal(layer.weight, w)
    assert cnn.RMSNorm.from_module(nn.RMSNorm(64, eps=0.0)).eps == 0.0
    bare = cnn.RMSNorm.from_module(nn.RMSNorm(64, eps=1e-5, elementwise_affine=False))
    assert bare.eps == 1e-5 and bare.hidden_size == 64 and torch.equal(
        bare.weight, torch.ones(64, dtype=torch.bfloat16))

    class HFNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.variance_epsilon = nn.Parameter(torch.ones(128)), 1e-5

        def forward(self, x):        # as Hugging Face's Llama norm: rounded, then weighted
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * xf.to(x.dtype)

    assert cnn.RMSNorm.from_module(HFNorm()).eps == 1e-5
    with pytest.raises(ValueError, match="norm: normalized shape"):
        cnn.RMSNorm.from_module(nn.RMSNorm((4, 64)))
    nameless = HFNorm()
    del nameless.variance_epsilon
    with pytest.raises(ValueError, match="norm: HFNorm has neither"):
        cnn.RMSNorm.from_module(nameless)
    with pytest.raises(ValueError, match=r"norm: normalized shape \(8, 8\)"):
        cnn.RMSNorm.from_module(nn.Linear(8, 8))


def test_rmsnorm_eps_none_is_fp32s_epsilon_as_torchs(monkeypatch):
    """torch.nn.RMSNorm(eps=None) takes fp32's machine epsilon for bf16, fp16 and fp32 inputs
    alike (it computes in fp32), whatever its weight's dtype; a converted one gives the op the
    same, and agrees with torch's module on rows small enough for eps to matter."""
    import codegen.ops as ops
    from codegen import reference

    seen = []
    monkeypatch.setattr(ops, "rmsnorm",
                        lambda x, w, eps: seen.append(eps) or reference.rmsnorm(x, w, eps))
    for affine in (True, False):
        src = nn.RMSNorm(64, eps=None, elementwise_affine=affine, dtype=torch.bfloat16)
        if affine:
            with torch.no_grad():
                src.weight.uniform_(0.5, 1.5)
        layer = cnn.RMSNorm.from_module(src)
        for dtype in (torch.float16, torch.float32, torch.bfloat16):
            # mean(x^2) = 9e-8 against eps = 1.2e-7: twice the eps moves y by a fifth
            x = torch.full((2, 64), 3e-4, dtype=dtype)
            assert torch.allclose(layer(x).float(), src.to(dtype)(x).float(), rtol=1e-2)
    assert set(seen) == {torch.finfo(torch.float32).eps}
    assert cnn.RMSNorm(64, eps=None).eps == torch.finfo(torch.float32).eps


def test_rmsnorm_from_module_refuses_norms_that_compute_something_else():
    """A module with .weight and .eps that is no RMSNorm (Gemma's x * (1 + weight),
    LayerNorm's centring and bias) is refused: converting it would change the model."""
    class GemmaNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.zeros(256)), 1e-6

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (xf * (1.0 + self.weight.float())).type_as(x)
    for norm in (GemmaNorm(), nn.LayerNorm(256)):
        with pytest.raises(ValueError, match="does not compute x \\* rsqrt"):
            cnn.RMSNorm.from_module(norm)


@pytest.fixture
def cpu_fp8(monkeypatch):
    """BlockFP8Linear on the CPU: the device's FP8 as an H100's (e4m3fn, 448), or as gfx942's
    with fnuz=True."""
    def use(fnuz=False):
        fmt = (torch.float8_e4m3fnuz, 224.0) if fnuz else (torch.float8_e4m3fn, 448.0)
        monkeypatch.setattr(cnn, "device_fp8", lambda device: fmt)
    use()
    return use


def test_block_fp8_linear_keeps_its_weight_through_dtype_casts(cpu_fp8):
    """.half() / .to(dtype) on a converted model: the FP8 weight and its fp32 scales stay as
    they are (a cast would ruin the scales), the output dtype follows."""
    lin = nn.Linear(256, 384).to(torch.bfloat16)
    layer = cnn.BlockFP8Linear.from_linear(lin)
    w, s = layer.weight.clone(), layer.weight_scale_inv.clone()
    layer.half()
    assert layer.weight.dtype == torch.float8_e4m3fn and torch.equal(
        layer.weight.view(torch.uint8), w.view(torch.uint8))
    assert layer.weight_scale_inv.dtype == torch.float32 and torch.equal(
        layer.weight_scale_inv, s)
    assert layer.out_dtype == torch.float16 and layer.bias.dtype == torch.float16
    layer.to("cpu", torch.float32)
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.out_dtype == torch.float32
    with pytest.raises(ValueError, match="in_features: 400 is not a multiple of 128"):
        cnn.BlockFP8Linear.from_linear(nn.Linear(400, 256))


def test_block_fp8_linear_adds_its_bias_in_the_output_dtype(cpu_fp8, monkeypatch):
    layer = cnn.BlockFP8Linear.from_linear(nn.Linear(256, 128).half(), device="cpu")
    layer.bias.data.fill_(300.7)

    class Ops:      # the GEMM's bf16 output: zeros
        per_token_group_quant_fp8 = staticmethod(lambda x, g: (x, None))
        gemm_a8w8_blockscale = staticmethod(
            lambda q, s, w, ws: torch.zeros(q.shape[0], w.shape[0], dtype=torch.bfloat16))
    monkeypatch.setattr(cnn, "_OPS", Ops)
    y = layer(torch.zeros(2, 256, dtype=torch.float16))
    assert y.dtype == torch.float16 and (y == torch.tensor(300.7, dtype=torch.float16)).all()


def test_block_fp8_linear_builds_on_meta_then_loads(cpu_fp8, monkeypatch):
    """Meta-device init (a model too large to build twice), to_empty, then a checkpoint."""
    src = cnn.BlockFP8Linear.from_linear(nn.Linear(256, 200), device="cpu")
    asked, fmt = [], cnn.device_fp8(None)
    monkeypatch.setattr(cnn, "device_fp8", lambda d: asked.append(d) or fmt)
    layer = cnn.BlockFP8Linear(256, 200, device="meta")
    with torch.device("meta"):
        assert cnn.BlockFP8Linear(256, 200).weight.is_meta     # the context's device
    assert layer.weight.is_meta and all(d.type != "meta" for d in asked)
    layer.to_empty(device="cpu")
    layer.load_state_dict(src.state_dict())
    assert torch.equal(layer.weight.view(torch.uint8), src.weight.view(torch.uint8))
    assert torch.equal(layer.weight_scale_inv, src.weight_scale_inv)
    assert torch.equal(layer.bias, src.bias)


def test_block_fp8_linear_loads_its_bias_and_buffers_as_they_come(cpu_fp8, monkeypatch):
    src = cnn.BlockFP8Linear.from_linear(nn.Linear(256, 128).half(), device="cpu")
    src.bias.data.fill_(300.7)      # 300.75 in fp16, 300 in bf16
    layer = cnn.BlockFP8Linear(256, 128, device="cpu")
    layer.load_state_dict(src.state_dict())
    assert layer.bias.dtype == torch.float16 and layer.bias[0].item() == 300.75

    class Ops:      # the GEMM's bf16 output: zeros
        per_token_group_quant_fp8 = staticmethod(lambda x, g: (x, None))
        gemm_a8w8_blockscale = staticmethod(
            lambda q, s, w, ws: torch.zeros(q.shape[0], w.shape[0], dtype=torch.bfloat16))
    monkeypatch.setattr(cnn, "_OPS", Ops)
    assert layer(torch.zeros(2, 256, dtype=torch.float16))[0, 0].item() == 300.75
    # assign=True with Parameters (keep_vars=True): weight and scales stay buffers
    state = {k: nn.Parameter(v, requires_grad=False) for k, v in src.state_dict().items()}
    layer.load_state_dict(state, assign=True)
    assert set(layer._buffers) == {"weight", "weight_scale_inv"}
    assert [n for n, _ in layer.named_parameters()] == ["bias"]


def test_an_e4m3fn_state_dict_loads_on_an_fnuz_device(cpu_fp8):
    fn_layer = cnn.BlockFP8Linear.from_linear(nn.Linear(256, 128, bias=False), device="cpu")
    state = fn_layer.state_dict()
    cpu_fp8(fnuz=True)
    fnuz_layer = cnn.BlockFP8Linear(256, 128, bias=False, device="cpu")
    fnuz_layer.load_state_dict(state)
    want_w, want_s = cnn.e4m3fn_to_device(state["weight"], state["weight_scale_inv"],
                                          torch.float8_e4m3fnuz)
    assert torch.equal(fnuz_layer.weight.view(torch.uint8), want_w.view(torch.uint8))
    assert torch.equal(fnuz_layer.weight_scale_inv, want_s)
    assert not torch.isnan(fnuz_layer.weight.float()).any()
    # a sharded load (strict=False) that brings the weight without its scales is refused
    with pytest.raises(ValueError, match="weight: torch.float8_e4m3fn .* weight_scale_inv"):
        fnuz_layer.load_state_dict({"weight": state["weight"]}, strict=False)


def test_convert_keeps_shared_layers_shared_and_names_what_it_cannot_convert(cpu_fp8):
    shared = nn.Linear(256, 256)
    model = nn.Sequential(nn.Sequential(shared), nn.Sequential(shared), nn.Linear(128, 64))
    cnn.convert(model, skip=lambda name, lin: lin.in_features == 128)
    assert model[0][0] is model[1][0] and isinstance(model[0][0], cnn.BlockFP8Linear)
    bad = nn.Sequential(nn.Linear(256, 256), nn.Linear(100, 8))
    with pytest.raises(ValueError, match=r"model: 1 \(in_features 100\)"):
        cnn.convert(bad)
    assert type(bad[0]) is nn.Linear          # nothing replaced
    assert isinstance(cnn.convert(nn.Linear(256, 8)), cnn.BlockFP8Linear)


def test_convert_asks_skip_by_qualified_name_and_leaves_subclasses(cpu_fp8):
    class Custom(nn.Linear):
        pass

    model = nn.Sequential(nn.Sequential(nn.Linear(128, 128), Custom(128, 128)),
                          nn.ModuleDict({"head": nn.Linear(128, 8)}))
    asked = []
    cnn.convert(model, skip=lambda name, lin: asked.append(name) or name.endswith("head"))
    assert asked == ["0.0", "1.head"]         # the subclass is never offered
    assert isinstance(model[0][0], cnn.BlockFP8Linear)
    assert type(model[0][1]) is Custom and type(model[1]["head"]) is nn.Linear


def test_importing_everything_works_with_no_gpu_runtime():
    code = ("import codegen, codegen.ops, codegen.nn, codegen.vllm, codegen.aiter, codegen.cli, "
            "codegen.emu; "
            "print(codegen.supported().why_not['rmsnorm'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stderr
    assert "no GPU" in r.stdout


# ---- GPU ----

def _linear(k, n, bias=True, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias, device="cuda", dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5)
        if bias:
            lin.bias.copy_(torch.randn(n, device="cuda", generator=g))
    return lin


@gpu
@pytest.mark.parametrize("lead,k,n", [((5,), 512, 384), ((2, 3), 7168, 576), ((1,), 384, 130),
                                      ((0,), 256, 256)])
def test_block_fp8_linear_is_its_two_ops_and_close_to_bf16(lead, k, n):
    lin = _linear(k, n)
    layer = cnn.BlockFP8Linear.from_linear(lin)
    x = torch.randn(*lead, k, device="cuda", dtype=torch.bfloat16)
    y = layer(x)
    assert y.shape == (*lead, n) and y.dtype == torch.bfloat16
    q, s = ops.per_token_group_quant_fp8(x.reshape(-1, k), 128)
    by_hand = ops.gemm_a8w8_blockscale(q, s, layer.weight, layer.weight_scale_inv) + lin.bias
    assert_same(y.reshape(-1, n), by_hand, "BlockFP8Linear vs its ops")
    if x.numel():
        assert rel_err(y, lin(x)) < 0.05


@gpu
def test_block_fp8_linear_from_a_checkpoint_pair():
    """DeepSeek-V3 / Qwen3 FP8 layout: e4m3fn weight + weight_scale_inv, dequant = w * s."""
    lin = _linear(1024, 640, bias=False)
    q, s = cnn.quantize_weight(lin.weight, torch.float8_e4m3fn, 448.0)
    layer = cnn.BlockFP8Linear.from_fp8(q, s, out_dtype=torch.bfloat16)
    x = torch.randn(33, 1024, device="cuda", dtype=torch.bfloat16)
    deq = q.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:640]
    assert rel_err(layer(x), x.float() @ deq.t()) < 0.03


@gpu
def test_rmsnorm_module_plain_residual_and_fused_quant():
    h = 1024
    norm = cnn.RMSNorm(h, eps=1e-5, device="cuda")
    with torch.no_grad():
        norm.weight.copy_(torch.rand(h, device="cuda") + 0.5)
    x = torch.randn(3, 7, h, device="cuda", dtype=torch.bfloat16)
    assert_same(norm(x).view(-1, h), ops.rmsnorm(x.view(-1, h), norm.weight, 1e-5), "plain")
    res = torch.randn_like(x)
    res0 = res.clone()
    y, r = norm(x, res)
    assert r is res
    ry = res0.clone().view(-1, h)
    assert_same(y.view(-1, h), ops.fused_add_rmsnorm(x.view(-1, h), ry, norm.weight, 1e-5),
                "residual")
    assert_same(res.view(-1, h), ry, "residual written back")
    norm.quantize = True
    act = norm(x)
    assert isinstance(act, cnn.FP8Activation) and act.q.shape == x.shape
    q, s = ops.rmsnorm_group_quant(x.view(-1, h), norm.weight, 1e-5, 128)
    assert_same(act.q.view(-1, h), q, "quant q")
    assert_same(act.scales.reshape(-1, h // 128), s, "quant scales")
    layer = cnn.BlockFP8Linear.from_linear(_linear(h, 256))
    fused = layer(act)
    by_hand = ops.gemm_a8w8_blockscale(q, s, layer.weight, layer.weight_scale_inv) + layer.bias
    assert_same(fused.view(-1, 256), by_hand, "linear(FP8Activation)")


@gpu
def test_modules_under_torch_compile_and_cuda_graphs():
    h, n = 512, 384
    norm = cnn.RMSNorm(h, quantize=True, device="cuda")
    lin = cnn.BlockFP8Linear.from_linear(_linear(h, n))
    lin2 = cnn.BlockFP8Linear.from_linear(_linear(n, h, seed=1))

    def block(x):
        return lin2(lin(norm(x)))
    x = torch.randn(2, 9, h, device="cuda", dtype=torch.bfloat16)
    eager = block(x)
    compiled = torch.compile(block, fullgraph=True)(x)
    assert_same(compiled, eager, "torch.compile")
    static = x.clone()
    block(static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = block(static)
    static.copy_(torch.randn_like(x))
    graph.replay()
    assert_same(out, block(static), "CUDA graph replay")


@gpu
def test_convert_replaces_linears_and_keeps_skipped_ones():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 2)).cuda().bfloat16()
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    ref = model(x)
    cnn.convert(model, skip=lambda name, lin: lin.out_features < 128)
    assert isinstance(model[0], cnn.BlockFP8Linear) and type(model[2]) is nn.Linear
    # e4m3 keeps 3 mantissa bits on activations and weights: a few % per value
    assert rel_err(model(x), ref) < 0.05


# ---- vLLM-named entry points ----

@gpu
def test_vllm_entry_points():
    check_vllm_entry_points("cuda")


# ---- AITER-named entry points ----

@gpu
def test_aiter_entry_points():
    check_aiter_entry_points("cuda")


@gpu
def test_aiter_entry_points_under_torch_compile():
    x = torch.randn(9, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(512, device="cuda", dtype=torch.bfloat16) + 0.5
    fp8 = ops.per_token_group_quant_fp8(x, 128)[0].dtype

    def f(x):
        q, s = aiter.per_group_quant_hip(x, quant_dtype=fp8, transpose_scale=True)
        (fq, fs), _, out2, _ = aiter.fused_rms_fp8_group_quant(x, w, 1e-6, x[:, :256],
                                                                w[:256], 1e-6)
        return q, s, fq, fs, out2, aiter.rms_norm(x, w, 1e-6)
    for got, want in zip(torch.compile(f, fullgraph=True)(x), f(x)):
        assert got.stride() == want.stride()
        assert_same(got, want, "aiter under torch.compile")


@gpu
def test_supported_on_this_gpu():
    s = supported()
    assert s.arch is not None and s["nn.BlockFP8Linear"] and s["rmsnorm"], str(s)
