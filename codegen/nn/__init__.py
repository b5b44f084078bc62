"""torch.nn modules over the ops: a block-FP8 linear layer and RMSNorm that feeds it.

    linear = BlockFP8Linear.from_linear(nn.Linear(7168, 2112).cuda())   # weight -> FP8 blocks
    norm = RMSNorm(7168, quantize=True).cuda()                          # emits FP8Activation
    y = linear(norm(x))                                                 # any leading dims

    convert(model)   # every nn.Linear of a model, in place (skip= names to keep)

BlockFP8Linear's forward is per_token_group_quant_fp8 (1 x 128 groups) then
gemm_a8w8_blockscale against the 128 x 128-block weight; given an FP8Activation (RMSNorm with
quantize=True) it skips the quant. Both work under torch.compile(fullgraph=True) and CUDA graphs.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import nn

BLOCK = 128


class FP8Activation(NamedTuple):
    """Activations already quantized for a BlockFP8Linear: q [..., K] fp8, scales [..., K/128]
    fp32 (one per token and 128 columns), dtype: the dtype the unquantized values had."""
    q: torch.Tensor
    scales: torch.Tensor
    dtype: torch.dtype


_OPS = None


def _ops():
    """codegen.ops, imported on first use (an import statement in forward costs ~1 us a call)."""
    global _OPS
    if _OPS is None:
        from .. import ops

        _OPS = ops
    return _OPS


def device_fp8(device: torch.device) -> tuple[torch.dtype, float]:
    """The FP8 dtype and max the GEMM takes on a device (e4m3fnuz / 224 on gfx942)."""
    from ..dispatch import arch_of
    from ..targets import get_target

    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"device: BlockFP8Linear needs a GPU (cuda/hip device), got {device}"
                         + ("" if device.type != "cuda" else " with no GPU visible to torch"))
    index = device.index if device.index is not None else torch.cuda.current_device()
    target = get_target(arch_of(index))
    if not target.has_fp8:
        raise ValueError(f"device: arch {target.arch} has no FP8 support")
    fmt = target.fp8_format()
    return getattr(torch, fmt.torch_dtype), fmt.max


def quantize_weight(w: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float,
                    block: tuple[int, int] = (BLOCK, BLOCK)) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], fp32 scale_inv [ceil(N/128), ceil(K/128)]): one scale per
    128 x 128 block (or per `block`), amax / fp8_max, on w's device; w ~= q * scale_inv
    blockwise."""
    (n, k), (rows, cols) = w.shape, block
    pn, pk = -(-n // rows) * rows, -(-k // cols) * cols
    wp = torch.zeros(pn, pk, device=w.device, dtype=torch.float32)
    wp[:n, :k] = w.float()
    blocks = wp.view(pn // rows, rows, pk // cols, cols)
    s = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-10) / fp8_max
    q = (blocks / s[:, None, :, None]).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return q.view(pn, pk)[:n, :k].contiguous(), s


def e4m3fn_to_device(weight: torch.Tensor, scale_inv: torch.Tensor, fp8_dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """A checkpoint's e4m3fn weight on a device whose FP8 is e4m3fnuz: the same bits mean half
    the value there (exponent bias 8, not 7), so scales double; -0 (0x80, NaN in fnuz) -> 0,
    and NaN (0x7f / 0xff, +-240 in fnuz) -> fnuz's NaN."""
    if weight.dtype == fp8_dtype:
        return weight, scale_inv
    if weight.dtype != torch.float8_e4m3fn or fp8_dtype != torch.float8_e4m3fnuz:
        raise TypeError(f"weight: dtype {weight.dtype} cannot be used as {fp8_dtype}")
    bits = weight.view(torch.uint8)
    bits = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
    bits = torch.where(bits & 0x7F == 0x7F, torch.full_like(bits, 0x80), bits)
    return bits.view(torch.float8_e4m3fnuz), scale_inv * 2


class BlockFP8Linear(nn.Module):
    """y = x @ W^T + b with W in FP8, one fp32 scale per 128 x 128 block (weight_scale_inv, as
    DeepSeek-V3 and Qwen3 FP8 checkpoints store it), and x quantized per token and 128 columns
    on each call. Output: out_dtype (default: x's dtype), computed as bf16 by the GEMM."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device=None, out_dtype: torch.dtype | None = None):
        super().__init__()
        if in_features % BLOCK:
            raise ValueError(f"in_features: {in_features} is not a multiple of {BLOCK} (each "
                             f"call quantizes x in groups of {BLOCK} columns)")
        if device is None:     # a meta (or cuda) default device, as `with torch.device(...)` sets
            default = torch.get_default_device()
            device = default if default.type in ("meta", "cuda") else "cuda"
        device = torch.device(device)
        # on meta (materialized later by to_empty), the FP8 format of the GPU it will run on
        fp8, _ = device_fp8(torch.device("cuda") if device.type == "meta" else device)
        self.in_features, self.out_features, self.out_dtype = in_features, out_features, out_dtype
        self.register_buffer("weight", torch.zeros(out_features, in_features, device=device,
                                                   dtype=fp8))
        self.register_buffer("weight_scale_inv", torch.ones(
            -(-out_features // BLOCK), -(-in_features // BLOCK), device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device,
                                             dtype=out_dtype or torch.bfloat16),
                                 requires_grad=False) if bias else None

    def _apply(self, fn, recurse=True):
        """.to(device) moves the FP8 weight and its fp32 scales; dtype casts (.half(),
        .to(dtype)) leave them as they are (a cast would ruin both) and set out_dtype."""
        kept = {name: self._buffers.pop(name) for name in ("weight", "weight_scale_inv")}
        try:
            super()._apply(fn, recurse)
        finally:
            for name, t in kept.items():
                to = fn(torch.empty(0, device=t.device)).device
                # meta tensors hold no data: to_empty() gets uninitialized ones, as for parameters
                self._buffers[name] = torch.empty_like(t, device=to) if t.is_meta else t.to(to)
        if self.out_dtype is not None:
            self.out_dtype = fn(torch.empty(0, dtype=self.out_dtype)).dtype
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # weight and scales stay buffers: assign=True with Parameters (state_dict(keep_vars=True)
        # of a module that holds them so) would make them parameters
        for key in (prefix + "weight", prefix + "weight_scale_inv"):
            if isinstance(state_dict.get(key), nn.Parameter):
                state_dict[key] = state_dict[key].detach()
        # without out_dtype the bias keeps the checkpoint's precision (a bf16 copy would round it)
        b = state_dict.get(prefix + "bias")
        if (self.bias is not None and self.out_dtype is None and isinstance(b, torch.Tensor)
                and b.is_floating_point() and b.dtype != self.bias.dtype):
            self.bias = nn.Parameter(torch.empty_like(self.bias, dtype=b.dtype),
                                     requires_grad=False)
        # an e4m3fn checkpoint on a device whose FP8 is e4m3fnuz: converted, scales doubled
        w, s = state_dict.get(prefix + "weight"), state_dict.get(prefix + "weight_scale_inv")
        if w is not None and w.dtype != self.weight.dtype:
            if s is None:     # copied alone, it would be cast by value: 448 is past fnuz's 240
                raise ValueError(f"{prefix}weight: {w.dtype} on a device whose FP8 is "
                                 f"{self.weight.dtype} loads only with {prefix}weight_scale_inv "
                                 f"in the same state dict (converted together, the scales "
                                 f"double)")
            state_dict[prefix + "weight"], state_dict[prefix + "weight_scale_inv"] = \
                e4m3fn_to_device(w, s, self.weight.dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @classmethod
    def from_linear(cls, linear: nn.Linear, device=None) -> "BlockFP8Linear":
        """Quantizes linear's weight to FP8 128 x 128 blocks on the GPU (device, default:
        the linear's own if it is on a GPU, else the current one)."""
        w = linear.weight.detach()
        device = torch.device(device) if device is not None else (
            w.device if w.is_cuda or not torch.cuda.is_available() else
            torch.device("cuda", torch.cuda.current_device()))
        fp8, fmax = device_fp8(device)
        q, s = quantize_weight(w.to(device), fp8, fmax)
        return cls.from_fp8(q, s, linear.bias, out_dtype=w.dtype if w.dtype in (
            torch.bfloat16, torch.float16) else None)

    @classmethod
    def from_fp8(cls, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                 bias: torch.Tensor | None = None,
                 out_dtype: torch.dtype | None = None) -> "BlockFP8Linear":
        """From a checkpoint's FP8 weight [N, K] and its weight_scale_inv
        [ceil(N/128), ceil(K/128)] fp32 (dequant: weight * scale_inv per block), on weight's
        GPU; e4m3fn weights are converted where the device's FP8 is e4m3fnuz."""
        if weight.dim() != 2:
            raise ValueError(f"weight: expected [out_features, in_features], got shape "
                             f"{tuple(weight.shape)}")
        n, k = weight.shape
        expected = (-(-n // BLOCK), -(-k // BLOCK))
        if tuple(weight_scale_inv.shape) != expected:
            raise ValueError(f"weight_scale_inv: shape {tuple(weight_scale_inv.shape)}, expected "
                             f"{expected} (one scale per 128 x 128 block of weight {n} x {k})")
        if weight_scale_inv.dtype != torch.float32:
            raise TypeError(f"weight_scale_inv: dtype {weight_scale_inv.dtype}, expected "
                            f"torch.float32")
        layer = cls(k, n, bias=bias is not None, device=weight.device, out_dtype=out_dtype)
        q, s = e4m3fn_to_device(weight, weight_scale_inv.to(weight.device), layer.weight.dtype)
        layer.weight.copy_(q)
        layer.weight_scale_inv.copy_(s)
        if bias is not None:      # in its own dtype, added after the cast to the output's
            layer.bias = nn.Parameter(bias.detach().to(weight.device).clone(),
                                      requires_grad=False)
        return layer

    def forward(self, x: torch.Tensor | FP8Activation) -> torch.Tensor:
        # Eager decode calls are host-bound: the tensors come from the module's dicts (not
        # Module.__getattr__, ~0.8 us a name) and 2-D inputs skip the reshapes.
        ops = _ops()
        if isinstance(x, FP8Activation):
            q, s, dtype = x
            flat = q.dim() != 2
            if flat:
                lead = q.shape[:-1]
                q, s = q.reshape(-1, q.shape[-1]), s.reshape(-1, s.shape[-1])
        else:
            dtype = x.dtype
            flat = x.dim() != 2
            if flat:
                lead = x.shape[:-1]
                x = x.reshape(-1, x.shape[-1])
            q, s = ops.per_token_group_quant_fp8(x, BLOCK)
        buffers = self._buffers
        y = ops.gemm_a8w8_blockscale(q, s, buffers["weight"], buffers["weight_scale_inv"])
        out = self.out_dtype or dtype
        if y.dtype != out:
            y = y.to(out)
        bias = self._parameters.get("bias")
        if bias is not None:
            y = y + (bias if bias.dtype == out else bias.to(out))
        return y.view(*lead, self.out_features) if flat else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, fp8={self.weight.dtype}")


class RMSNorm(nn.Module):
    """RMSNorm over the last dim: forward(x) -> y; forward(x, residual) -> (y, residual) with
    residual = x + residual updated in place (vLLM's convention). quantize=True: y comes as an
    FP8Activation for the next BlockFP8Linear (RMSNorm and its FP8 quant in one kernel).
    weight=None (elementwise_affine=False): a unit weight. eps=None: fp32's machine epsilon,
    as torch.nn.RMSNorm takes it for the bf16, fp16 and fp32 inputs it computes in fp32."""

    def __init__(self, hidden_size: int, eps: float | None = 1e-6, elementwise_affine: bool = True,
                 quantize: bool = False, device=None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.hidden_size, self.quantize = hidden_size, quantize
        self.eps = eps if eps is not None else torch.finfo(torch.float32).eps
        w = torch.ones(hidden_size, device=device, dtype=dtype)
        if elementwise_affine:
            self.weight = nn.Parameter(w, requires_grad=False)
        else:
            self.register_buffer("weight", w, persistent=False)

    @classmethod
    def from_module(cls, norm: nn.Module, quantize: bool = False) -> "RMSNorm":
        """From torch.nn.RMSNorm or any module with .weight and .eps / .variance_epsilon that
        normalizes over the last dim (torch's eps=None is fp32's machine epsilon, whatever the
        input's dtype). The module is run once on a probe and must give what
        RMSNorm gives: one that computes something else (Gemma's x * (1 + weight), LayerNorm's
        mean subtraction) is refused."""
        w = getattr(norm, "weight", None)
        shape = tuple(getattr(norm, "normalized_shape", None) or
                      (w.shape if w is not None else ()))
        if len(shape) != 1:
            raise ValueError(f"norm: normalized shape {shape} (from .normalized_shape or "
                             ".weight); RMSNorm normalizes over the last dim only")
        dtype = w.dtype if w is not None else torch.bfloat16
        if hasattr(norm, "eps"):
            eps = norm.eps
        elif hasattr(norm, "variance_epsilon"):
            eps = norm.variance_epsilon
        else:
            raise ValueError(f"norm: {type(norm).__name__} has neither .eps nor "
                             ".variance_epsilon")
        layer = cls(shape[0], eps, elementwise_affine=w is not None, quantize=quantize,
                    device=w.device if w is not None else None, dtype=dtype)
        if w is not None:
            layer.weight.data.copy_(w.detach())
        _same_as_rmsnorm(norm, layer.weight, layer.eps)
        return layer

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        ops = _ops()     # as BlockFP8Linear.forward: dicts, no reshapes of 2-D rows
        h, flat = x.shape[-1], x.dim() != 2
        x2 = x.reshape(-1, h) if flat else x
        w = self._parameters.get("weight")
        if w is None:            # elementwise_affine=False: a buffer
            w = self._buffers["weight"]
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        if residual is not None and flat and residual.shape != x.shape:   # else paired wrongly
            raise ValueError(f"residual: shape {tuple(residual.shape)} must match x "
                             f"{tuple(x.shape)}")
        r2 = residual.reshape(-1, h) if residual is not None and flat else residual
        if self.quantize:
            q, s = ops.rmsnorm_group_quant(x2, w, self.eps, BLOCK, residual=r2)
            y = (FP8Activation(q.view(x.shape), s.view(*x.shape[:-1], h // BLOCK), x.dtype)
                 if flat else FP8Activation(q, s, x.dtype))
        elif residual is not None:
            y = ops.fused_add_rmsnorm(x2, r2, w, self.eps)
        else:
            y = ops.rmsnorm(x2, w, self.eps)
        if flat and not self.quantize:
            y = y.view(x.shape)
        if r2 is not None and flat and not residual.is_contiguous():
            residual.copy_(r2.view(residual.shape))     # reshape may have copied: the sum back
        return y if residual is None else (y, residual)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, quantize={self.quantize}"


def _same_as_rmsnorm(norm: nn.Module, weight: torch.Tensor, eps: float) -> None:
    """norm, run on a probe (rows with a mean, so that centring shows), agrees with
    x * rsqrt(mean(x^2) + eps) * weight to within its own roundings."""
    from .. import reference

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, weight.shape[0], generator=g) + 1.0).to(weight.device, weight.dtype)
    try:
        with torch.no_grad():
            got = norm(x)
    except Exception as e:       # noqa: BLE001 (the module's own error, named below)
        raise ValueError(f"norm: {type(norm).__name__}(x) failed on a probe ({e}); build "
                         f"RMSNorm(hidden_size, eps) and copy its weight instead") from None
    want = reference.rmsnorm_fp32(x, weight, eps)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or \
            (got.float() - want).abs().max() > 0.02 * want.abs().max():
        raise ValueError(f"norm: {type(norm).__name__} does not compute x * rsqrt(mean(x^2) + "
                         f"eps) * weight on a probe (a (1 + weight) scale, a mean subtracted, "
                         f"a bias?); RMSNorm would change the model")


def convert(model: nn.Module, skip: Callable[[str, nn.Linear], bool] | None = None,
            device=None) -> nn.Module:
    """Replaces every nn.Linear of model (in place; nn.Linear itself, not its subclasses) by a
    BlockFP8Linear, except those for which skip(qualified_name, linear) is true; returns model
    (a bare nn.Linear: its BlockFP8Linear). A layer shared by several parents stays shared. A
    layer that cannot be converted (in_features not a multiple of 128) is named before any is
    replaced."""
    if type(model) is nn.Linear:
        return BlockFP8Linear.from_linear(model, device=device)
    chosen = []
    for name, module in model.named_modules(remove_duplicate=False):
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and not (skip and skip(full, child)):
                chosen.append((module, child_name, full, child))
    bad = [f"{full} (in_features {c.in_features})" for _, _, full, c in chosen
           if c.in_features % BLOCK]
    if bad:
        raise ValueError(f"model: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}: "
                         f"in_features must be a multiple of {BLOCK}; pass skip= to keep them")
    converted: dict[int, BlockFP8Linear] = {}
    for module, child_name, _, child in chosen:
        if id(child) not in converted:
            converted[id(child)] = BlockFP8Linear.from_linear(child, device=device)
        setattr(module, child_name, converted[id(child)])
    return model
