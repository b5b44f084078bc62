"""FP8 matrix instructions as data: which lane feeds which row, column and K slice.

The portable GEMM kernel (templates/gemm_a8w8_blockscale_mma.cu.j2) is written once for every
target; what differs is the matrix instruction, described here. Each index below is an
expression of `lane` that is valid C and valid Python, so the same text is rendered into the
kernel and evaluated by the lane-level model in tests/test_gemm_lane_model.py, which checks it
against the instruction's operand layout as AMD's and NVIDIA's documents state it.

For every instruction listed, a lane holds 8 (or, for CDNA4's f8f6f4 MFMA, 32) fp8 bytes of
each A row it feeds and as many of its B column, and those bytes sit in the same K positions for
A and B ("kgroup" picks which slice of the instruction's K). The kernel loads 16 bytes per row
and kgroup and gives the low 8 to one instruction and the high 8 to the next (or two 16-byte
loads to one 32-byte instruction): a K order that differs from memory order, but the same for A
and B, so the dot products are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Atom:
    name: str                 # the cg:: function in templates/include/codegen/arch_*.h
    mnemonic: str             # how the instruction appears in assembly
    rows: int                 # M of one instruction
    cols: int                 # N of one instruction
    k: int                    # K of one instruction
    wave: int                 # lanes that issue it together
    kgroups: int              # K slices per row, one per lane group: k == lane_bytes * kgroups
    a_rows: tuple[str, ...]   # the A rows (0..rows) a lane feeds, one 8-byte operand each
    a_kgroup: str             # which 8-byte K slice of those rows
    b_col: str                # the B column (0..cols) a lane feeds
    b_kgroup: str
    c: tuple[tuple[str, str], ...]   # (row, col) of each accumulator register of a lane
    lane_bytes: int = 8       # bytes of a row one lane feeds one instruction
    cycles: int = 0           # issue-to-issue cycles on one SIMD (AMD; 0: not modelled)

    @property
    def chunk(self) -> int:
        """Bytes of a row a lane reads per step: 16 (one load, two 8-byte instructions) or
        the instruction's own operand (two loads, one 32-byte instruction)."""
        return max(16, self.lane_bytes)

    @property
    def pair_k(self) -> int:
        """K covered by one step of every lane's chunk."""
        return self.chunk * self.kgroups

    @property
    def per_chunk(self) -> int:
        """Instructions fed by one chunk."""
        return self.chunk // self.lane_bytes


ATOMS = {a.name: a for a in (
    # gfx942 / gfx950 (wave64): D[16x16] += A[16x32] B[32x16]
    Atom("mfma_f32_16x16x32_fp8", "v_mfma_f32_16x16x32_fp8_fp8", 16, 16, 32, 64, 4,
         a_rows=("(lane & 15)",), a_kgroup="(lane >> 4)",
         b_col="(lane & 15)", b_kgroup="(lane >> 4)",
         c=tuple((f"((lane >> 4) * 4 + {i})", "(lane & 15)") for i in range(4)), cycles=16),
    # gfx942 / gfx950 (wave64): D[32x32] += A[32x16] B[16x32]; D row 8 (r / 4) + 4 (lane / 32)
    # + r % 4 in register r (AMD Matrix Instruction Calculator, CDNA3: 16 cycles for 16x16x32,
    # 32 for 32x32x16)
    Atom("mfma_f32_32x32x16_fp8", "v_mfma_f32_32x32x16_fp8_fp8", 32, 32, 16, 64, 2,
         a_rows=("(lane & 31)",), a_kgroup="(lane >> 5)",
         b_col="(lane & 31)", b_kgroup="(lane >> 5)",
         c=tuple((f"((lane >> 5) * 4 + {8 * (i // 4) + i % 4})", "(lane & 31)")
                 for i in range(16)), cycles=32),
    # gfx950 (wave64): D[16x16] += A[16x128] B[128x16], FP8 x FP8 (cbsz = blgp = 0), no
    # scaling; 32 bytes of a row per lane. Twice gfx942's FP8 rate: 8 passes for 4x the K.
    Atom("mfma_f32_16x16x128_f8f6f4", "v_mfma_f32_16x16x128_f8f6f4", 16, 16, 128, 64, 4,
         a_rows=("(lane & 15)",), a_kgroup="(lane >> 4)",
         b_col="(lane & 15)", b_kgroup="(lane >> 4)",
         c=tuple((f"((lane >> 4) * 4 + {i})", "(lane & 15)") for i in range(4)), lane_bytes=32,
         cycles=32),
    # gfx950 (wave64): D[32x32] += A[32x64] B[64x32], FP8 x FP8, no scaling; 32 bytes of a row
    # per lane (K split over lanes l and l + 32), D as the other 32 x 32 MFMAs. 16 passes:
    # 16x16x128's rate for twice the outputs per instruction.
    Atom("mfma_f32_32x32x64_f8f6f4", "v_mfma_f32_32x32x64_f8f6f4", 32, 32, 64, 64, 2,
         a_rows=("(lane & 31)",), a_kgroup="(lane >> 5)",
         b_col="(lane & 31)", b_kgroup="(lane >> 5)",
         c=tuple((f"((lane >> 5) * 4 + {8 * (i // 4) + i % 4})", "(lane & 31)")
                 for i in range(16)), lane_bytes=32, cycles=64),
    # gfx1200 / gfx1201 (wave32): D[16x16] += A[16x16] B[16x16] (8 cycles: the calculator, RDNA4)
    Atom("wmma_f32_16x16x16_fp8", "v_wmma_f32_16x16x16_fp8_fp8", 16, 16, 16, 32, 2,
         a_rows=("(lane & 15)",), a_kgroup="(lane >> 4)",
         b_col="(lane & 15)", b_kgroup="(lane >> 4)",
         c=tuple((f"((lane >> 4) * 8 + {i})", "(lane & 15)") for i in range(8)), cycles=8),
    # sm_89+ (warp32): mma.sync m16n8k32 e4m3; a lane's 8 bytes of a row are the registers
    # a0 / a2 (row lane/4) or a1 / a3 (row lane/4 + 8), its B bytes are b0 / b1.
    Atom("mma_m16n8k32_e4m3", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32",
         16, 8, 32, 32, 4,
         a_rows=("(lane >> 2)", "((lane >> 2) + 8)"), a_kgroup="(lane & 3)",
         b_col="(lane >> 2)", b_kgroup="(lane & 3)",
         c=(("(lane >> 2)", "((lane & 3) * 2)"), ("(lane >> 2)", "((lane & 3) * 2 + 1)"),
            ("((lane >> 2) + 8)", "((lane & 3) * 2)"),
            ("((lane >> 2) + 8)", "((lane & 3) * 2 + 1)"))),
)}

# The instruction each target's portable GEMM kernels use by default.
TARGET_ATOM = {"gfx942": "mfma_f32_16x16x32_fp8", "gfx950": "mfma_f32_16x16x32_fp8",
               "gfx1200": "wmma_f32_16x16x16_fp8", "gfx1201": "wmma_f32_16x16x16_fp8",
               "sm_90a": "mma_m16n8k32_e4m3"}
# The larger instructions the lds kernel may take instead (the GEMM's `atom` axis), by arch.
LARGE_ATOMS = {"32x32x16": ("mfma_f32_32x32x16_fp8", ("gfx942", "gfx950")),
               "16x16x128": ("mfma_f32_16x16x128_f8f6f4", ("gfx950",)),
               "32x32x64": ("mfma_f32_32x32x64_f8f6f4", ("gfx950",))}


def atom_for(arch: str, kernel: str = "mma", atom: str = "") -> Atom | None:
    """The instruction of a kernel: the target's default, or the `atom` axis' choice (lds)."""
    if atom:
        name, archs = LARGE_ATOMS.get(atom, ("", ()))
        return ATOMS[name] if kernel == "lds" and arch in archs else None
    name = TARGET_ATOM.get(arch)
    return ATOMS[name] if name else None


def uses() -> list[tuple[str, str, str, Atom]]:
    """(arch, kernel, atom axis value, instruction) of every portable kernel form."""
    out = [(arch, kernel, "", atom_for(arch, kernel)) for arch in TARGET_ATOM
           for kernel in ("mma", "lds")]
    return out + [(arch, "lds", value, ATOMS[name]) for value, (name, archs) in
                  LARGE_ATOMS.items() for arch in archs]


def evaluate(expr: str, lane: int) -> int:
    """An index expression at one lane (the expressions use only lane, ints, + * >> &)."""
    return int(eval(expr, {"__builtins__": {}}, {"lane": lane}))
