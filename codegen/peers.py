"""Other projects' Triton kernels that `make bench` times ours against, loaded at run time from
checkouts the user keeps outside this repository (nothing of theirs is part of it):

- CODEGEN_AITER=<checkout of ROCm/aiter>: aiter/ops/triton's RMSNorm, fused-add RMSNorm and
  fused RMSNorm + FP8 group quant. Only those modules are imported: aiter's package __init__
  files (which load its HIP JIT modules) are replaced by empty packages.
- CODEGEN_VLLM=<checkout of vllm-project/vllm>: the Triton per-token-group FP8 quant kernel of
  vllm/model_executor/layers/quantization/utils/fp8_utils.py, taken out of that file on its own
  (the module needs a full vLLM install) and launched as vLLM's fallback launches it.

Each getter returns None when its variable is unset or the checkout cannot be loaded (the
reason is printed once).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import tempfile
import types
from functools import cache
from pathlib import Path

import torch


def _fail(what: str, e: Exception) -> None:
    print(f"peers: {what} not loaded: {type(e).__name__}: {e}", file=sys.stderr)


@cache
def aiter():
    """Namespace(rmsnorm, fused_add_rmsnorm, rmsnorm_group_quant), or None."""
    root = os.environ.get("CODEGEN_AITER")
    if not root:
        return None
    try:
        pkg = Path(root) / "aiter"

        def package(name: str, path: Path, **attrs):
            m = types.ModuleType(name)
            m.__path__ = [str(path)]
            m.__dict__.update(attrs)
            sys.modules[name] = m
            if "." in name:
                parent, leaf = name.rsplit(".", 1)
                setattr(sys.modules[parent], leaf, m)

        # aiter.dtypes.fp8 is read when fused_fp8_quant loads; the calls below pass the dtype.
        package("aiter", pkg, dtypes=types.SimpleNamespace(fp8=torch.float8_e4m3fn))
        package("aiter.ops", pkg / "ops")
        package("aiter.ops.triton", pkg / "ops" / "triton")
        package("aiter.ops.triton.quant", pkg / "ops" / "triton" / "quant")
        sys.path.insert(0, str(root))
        quant = importlib.import_module("aiter.ops.triton.quant.fused_fp8_quant")
        norm = importlib.import_module("aiter.ops.triton.normalization.rmsnorm")
    except Exception as e:   # any failure of a foreign checkout: the bench runs without it
        _fail(f"AITER from {root}", e)
        return None

    def rmsnorm(x, w, eps=1e-6):
        return norm.rmsnorm_forward_inference(x, w, eps)

    def fused_add_rmsnorm(x, r, w, eps=1e-6):
        out, res = torch.empty_like(x), torch.empty_like(x)
        norm.rmsnorm2d_fwd_with_add(out, x, r, res, w, eps)
        return out, res

    def rmsnorm_group_quant(x, w, fp8_dtype, eps=1e-6, g=128):
        (q, s), _, _, _ = quant.fused_rms_fp8_group_quant(x, w, eps, group_size=g,
                                                          dtype_quant=fp8_dtype)
        return q, s

    return types.SimpleNamespace(rmsnorm=rmsnorm, fused_add_rmsnorm=fused_add_rmsnorm,
                                 rmsnorm_group_quant=rmsnorm_group_quant)


_VLLM_FILE = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"


@cache
def vllm_quant():
    """quant(x, g, fp8_dtype, fp8_max) -> (q, scales [T, H/g] row-major), or None."""
    root = os.environ.get("CODEGEN_VLLM")
    if not root:
        return None
    try:
        path = Path(root) / _VLLM_FILE
        text = path.read_text()
        fn = next(n for n in ast.parse(text).body
                  if isinstance(n, ast.FunctionDef) and n.name == "_per_token_group_quant_fp8")
        # triton.jit reads the kernel's source from its file: one of its own, outside the repo.
        first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
        body = "\n".join(text.splitlines()[first - 1:fn.end_lineno])
        out = Path(tempfile.mkdtemp(prefix="codegen-peer-")) / "vllm_group_quant.py"
        out.write_text("import triton\nimport triton.language as tl\n\n\n" + body + "\n")
        spec = importlib.util.spec_from_file_location("codegen_peer_vllm_group_quant", out)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        kernel = mod._per_token_group_quant_fp8
    except Exception as e:
        _fail(f"vLLM's Triton quant from {root}", e)
        return None

    def quant(x, g, fp8_dtype, fp8_max):
        t, h = x.shape
        q = torch.empty((t, h), dtype=fp8_dtype, device=x.device)
        s = torch.empty((t, h // g), dtype=torch.float32, device=x.device)
        block = 1 << (g - 1).bit_length()
        kernel[(t * h // g,)](x, q, s, g, h, x.stride(0), 1e-10, -fp8_max, fp8_max,
                              use_ue8m0=False, BLOCK=block,
                              num_warps=min(max(block // 256, 1), 8), num_stages=1)
        return q, s

    return quant
