"""Per-family decisions: validation beyond the spec, render context, launcher signature.

Templates hold code; every number they need (vector width, lanes per group, block size) is
computed here from the variant and its target.
"""
from __future__ import annotations

import importlib
from types import ModuleType

_MODULES = {
    "group_quant_fp8": "quant",
    "rmsnorm": "rmsnorm",
    "rmsnorm_group_quant": "rmsnorm_quant",
    "dual_rmsnorm_group_quant": "dual_rmsnorm_quant",
    "gemm_a8w8_blockscale": "gemm",
}


def get(family: str) -> ModuleType:
    try:
        return importlib.import_module(f".{_MODULES[family]}", __name__)
    except KeyError:
        raise ValueError(f"unknown kernel family {family!r}") from None
