"""GPU targets as data: everything that differs between architectures lives here.

Kernel templates never test an arch name; they read the traits below (through the
render context) and call the per-vendor primitives in templates/include/arch_*.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fp8Format:
    name: str          # "e4m3fn" (OCP) or "e4m3fnuz" (MI300)
    max: float         # the value that amax maps to when scaling
    torch_dtype: str   # attribute of torch

    @property
    def token(self) -> str:
        """Short name used in URIs: e4m3fn448, e4m3fnuz224."""
        return f"{self.name}{int(self.max)}"


E4M3FN = Fp8Format("e4m3fn", 448.0, "float8_e4m3fn")
E4M3FNUZ_224 = Fp8Format("e4m3fnuz", 224.0, "float8_e4m3fnuz")
E4M3FNUZ_240 = Fp8Format("e4m3fnuz", 240.0, "float8_e4m3fnuz")


@dataclass(frozen=True)
class Target:
    arch: str                  # gfx942, sm_90a, ...
    vendor: str                # "amd" or "nvidia"
    wave_size: int             # threads per wave / warp
    fp8_formats: tuple[Fp8Format, ...]   # first one is the default; empty: no FP8 in hardware
    matrix_fp8: str            # matrix instruction family for FP8, "" when none
    lds_bytes: int             # shared memory (LDS) one workgroup may use
    # register file, for the occupancy figure: per SIMD (AMD) / per SM (NVIDIA)
    regs_per_simd: int         # AMD: VGPRs per lane a SIMD holds; NVIDIA: 32-bit registers per SM
    reg_granule: int           # allocation granule (AMD: VGPRs, NVIDIA: registers per warp)
    max_waves_per_simd: int    # AMD: waves per SIMD; NVIDIA: warps per SM
    simds_per_cu: int          # AMD SIMDs per CU; NVIDIA: 1 (the SM)
    lds_per_cu: int            # LDS / shared memory per CU / SM
    lds_read_per_clk: int      # LDS bytes per clock per CU / SM: read
    lds_write_per_clk: int     # ... and written
    # the largest cache in front of device memory on the target's largest part, bytes: AMD's
    # Infinity Cache where the part has one (torch reports only the L2), else the L2
    cache_bytes: int
    # multiprocessors (HIP's CUs, NVIDIA's SMs) of that part: dispatch's count where it has no
    # device to ask
    multiprocessors: int

    @property
    def has_fp8(self) -> bool:
        return len(self.fp8_formats) > 0     # not bool(tuple): torch.compile traces this

    @property
    def is_hip(self) -> bool:
        return self.vendor == "amd"

    def fp8_format(self, fp8_max: float | None = None) -> Fp8Format:
        if not self.has_fp8:
            raise ValueError(f"arch {self.arch} has no FP8 conversion in hardware")
        if fp8_max is None:
            return self.fp8_formats[0]
        for f in self.fp8_formats:
            if f.max == fp8_max:
                return f
        raise ValueError(f"fp8_max={fp8_max} not offered on arch {self.arch}; "
                         f"choose one of {[f.max for f in self.fp8_formats]}")

    def occupancy(self, regs: int, lds: int, block_threads: int) -> int:
        """Resident waves per SIMD (AMD) or warps per SM (NVIDIA) for one kernel."""
        if regs <= 0:
            regs = 1
        g = self.reg_granule
        if self.vendor == "amd":
            by_regs = self.regs_per_simd // (-(-regs // g) * g)
            waves = min(self.max_waves_per_simd, by_regs)
            if lds:
                waves_per_block = -(-block_threads // self.wave_size)
                blocks = self.lds_per_cu // lds
                waves = min(waves, blocks * waves_per_block // self.simds_per_cu)
            return waves
        per_warp = -(-regs * 32 // g) * g
        warps_per_block = -(-block_threads // 32)
        blocks = self.regs_per_simd // (per_warp * warps_per_block)
        if lds:
            blocks = min(blocks, self.lds_per_cu // lds)
        return min(self.max_waves_per_simd, blocks * warps_per_block)

    def blocks_per_cu(self, regs: int, lds: int, block_threads: int) -> int:
        """AMD: blocks resident per CU (HIP's multiprocessor) at once; a block's waves spread
        over the SIMDs, so one of fewer waves than SIMDs leaves some idle unless more fit."""
        g = self.reg_granule
        waves_per_simd = min(self.max_waves_per_simd,
                             self.regs_per_simd // (-(-max(regs, 1) // g) * g))
        waves_per_block = -(-block_threads // self.wave_size)
        blocks = waves_per_simd * self.simds_per_cu // waves_per_block
        return min(blocks, self.lds_per_cu // lds) if lds else blocks


def _amd(arch, wave, fp8, matrix, lds, regs, granule, waves, cache_mib, cus, lds_cu=65536,
         lds_clk=(128, 128)):
    return Target(arch, "amd", wave, fp8, matrix, lds, regs, granule, waves, 4, lds_cu,
                  *lds_clk, cache_mib << 20, cus)


# Register-file figures are from AMD's ISA documents: CDNA3 has 512 (arch + acc) VGPRs per
# lane in granules of 8 and 8 waves per SIMD; RDNA3/4 in wave32 have 1536 VGPRs in granules
# of 24 (shown as 1536/24 slots) and 16 waves per SIMD. Caches (MiB) from ROCm's GPU
# specifications: MI300X / MI355X 256 (L2 32), R9700 64 (L2 8), RX 9060 XT 32 (L2 4), RX 7900
# XTX 96 (L2 6), one MI250X GCD no Infinity Cache (L2 8); H100 / H200: L2 50. Multiprocessors
# of the same parts: 304, 256, 32, 16, 48, 110; 132.
# A "CU" is what HIP counts as a multiprocessor: on RDNA, which runs in WGP mode by default,
# that is the WGP (two CUs, 4 SIMD32, 128 KB of LDS in 64 dword banks; a workgroup may use
# 64 KB); on CDNA3 the CU (4 SIMD16, 64 KB in 32 banks, a dword per bank and clock). CDNA4
# has 160 KB per CU and reads at twice CDNA3's rate (AMD's CDNA 4 disclosure); its write rate is
# taken as CDNA3's.
_WGP = dict(lds_cu=131072, lds_clk=(256, 256))     # RDNA's multiprocessor
TARGETS: dict[str, Target] = {t.arch: t for t in (
    _amd("gfx942", 64, (E4M3FNUZ_224, E4M3FNUZ_240), "mfma_fp8", 65536, 512, 8, 8, 256, 304),
    _amd("gfx950", 64, (E4M3FN,), "mfma_f8f6f4", 163840, 512, 8, 8, 256, 256, lds_cu=163840,
         lds_clk=(256, 128)),
    _amd("gfx1200", 32, (E4M3FN,), "wmma_fp8", 65536, 1536, 24, 16, 32, 16, **_WGP),
    _amd("gfx1201", 32, (E4M3FN,), "wmma_fp8", 65536, 1536, 24, 16, 64, 32, **_WGP),
    _amd("gfx1100", 32, (), "", 65536, 1536, 24, 16, 96, 48, **_WGP),
    _amd("gfx90a", 64, (), "", 65536, 512, 8, 8, 8, 110),
    Target("sm_90a", "nvidia", 32, (E4M3FN,), "wgmma_fp8", 232448, 65536, 256, 64, 1, 233472,
           128, 128, 50 << 20, 132),
)}


def get_target(arch: str) -> Target:
    try:
        return TARGETS[arch]
    except KeyError:
        raise ValueError(f"unknown arch {arch!r}; supported: {', '.join(TARGETS)}") from None


def native_arch() -> str:
    """The arch of the local GPU (device 0), e.g. sm_90a or gfx942."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("arch 'native' needs a visible GPU; none was found")
    return device_arch(torch.device("cuda", torch.cuda.current_device()))


def device_arch(device) -> str:
    import torch

    props = torch.cuda.get_device_properties(device)
    if getattr(torch.version, "hip", None):
        return props.gcnArchName.split(":")[0]
    major, minor = props.major, props.minor
    if (major, minor) == (9, 0):
        return "sm_90a"
    return f"sm_{major}{minor}"
