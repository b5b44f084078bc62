"""supported(device): what runs on a device and, for what does not, why. The one place a caller
asks instead of testing arch names; it never fails for want of a GPU, ROCm or CUDA."""
from __future__ import annotations

from dataclasses import dataclass, field

# public op -> kernel family that serves it
OPS = {
    "per_token_group_quant_fp8": "group_quant_fp8",
    "rmsnorm": "rmsnorm",
    "fused_add_rmsnorm": "rmsnorm",
    "rmsnorm_group_quant": "rmsnorm_group_quant",
    "dual_rmsnorm_group_quant": "dual_rmsnorm_group_quant",
    "gemm_a8w8_blockscale": "gemm_a8w8_blockscale",
}
# modules -> the ops they call
MODULES = {
    "nn.BlockFP8Linear": ("per_token_group_quant_fp8", "gemm_a8w8_blockscale"),
    "nn.RMSNorm": ("rmsnorm", "fused_add_rmsnorm", "rmsnorm_group_quant"),
}


@dataclass(frozen=True)
class Support:
    device: str
    arch: str | None
    why_not: dict[str, str | None] = field(default_factory=dict)   # None: it runs there

    def __getitem__(self, name: str) -> bool:
        return self.why_not[name] is None

    def __contains__(self, name: str) -> bool:
        return self.why_not.get(name, "") is None

    def runs(self) -> list[str]:
        return [n for n, r in self.why_not.items() if r is None]

    def __str__(self) -> str:
        head = f"{self.device}" + (f" ({self.arch})" if self.arch else "")
        rows = [f"  {n:<28} {'yes' if r is None else 'no: ' + r}" for n, r in self.why_not.items()]
        return "\n".join([head, *rows])


def supported(device=None) -> Support:
    """What of codegen.ops and codegen.nn runs on device (a torch.device, an index, an arch
    name such as "gfx942", or None: the current GPU)."""
    try:
        arch, name = _arch_of(device)
    except RuntimeError as e:
        where = "the current GPU" if device is None else (
            f"cuda:{device}" if isinstance(device, int) else str(device))
        return Support(where, None, {n: str(e) for n in (*OPS, *MODULES)})
    return Support(name, arch, _reasons(arch))


def _arch_of(device) -> tuple[str, str]:
    from .targets import TARGETS

    if isinstance(device, str) and device in TARGETS:
        return device, device
    if isinstance(device, str) and device.startswith(("gfx", "sm_")):
        raise RuntimeError(f"unknown arch {device!r}; the targets are {', '.join(TARGETS)}")
    try:
        import torch
    except ImportError:
        raise RuntimeError("torch is not installed") from None
    if not torch.cuda.is_available():
        raise RuntimeError("no GPU visible to torch (no CUDA or ROCm device)")
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(
        device if device is not None else "cuda")
    if dev.type != "cuda":
        raise RuntimeError(f"device {dev} is not a GPU")
    from .dispatch import arch_of

    index = dev.index if dev.index is not None else torch.cuda.current_device()
    try:
        arch = arch_of(index)
    except ValueError as e:
        raise RuntimeError(str(e)) from None
    return arch, f"cuda:{index} {torch.cuda.get_device_name(index)}"


def _reasons(arch: str) -> dict[str, str | None]:
    from .build import jit
    from .families import get as get_family
    from .spec import enumerate_variants, validate
    from .targets import get_target
    from .toolchain import ToolchainError, find

    target = get_target(arch)
    try:
        tc = find(target)
        build_why = None if tc.loadable else (
            f"toolchain {tc.name} builds assembly only, not loadable modules (set ROCM_PATH "
            f"to a ROCm install, or install prebuilt kernels for {arch})")
    except ToolchainError as e:
        build_why = f"{e}; or install prebuilt kernels for {arch}"
    family_why: dict[str, str | None] = {}
    for family in set(OPS.values()):
        chooser = getattr(get_family(family), "variants", None)
        variants = chooser(target) if chooser else enumerate_variants(family, target)
        valid = [v for v in variants if validate(v) is None]
        if not valid:
            family_why[family] = (validate(variants[0]) if variants else None) or (
                f"arch {arch} has no FP8 support" if not target.has_fp8 else
                f"no {family} variant for {arch}")
        elif build_why and not any(jit.aot_module(v) for v in valid[:1]):
            family_why[family] = build_why
        else:
            family_why[family] = None
    why = {op: family_why[f] for op, f in OPS.items()}
    for module, needs in MODULES.items():
        why[module] = next((f"{n}: {why[n]}" for n in needs if why[n]), None)
    return why
