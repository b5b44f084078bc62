"""FP8 block-scale GEMM: tile configs, their validation, and the per-target dispatch tables.

Three kernels share one launcher signature:
- "mma" (templates/gemm_a8w8_blockscale_mma.cu.j2), every FP8 target: one wave computes a
  block_m x block_n tile from fragments it loads itself (codegen/matrix.py names the matrix
  instruction per target); split_k waves of a block take interleaved 128-wide K blocks and are
  summed through LDS; a wave holds `stages` (1 or 2) K blocks of fragments in registers. On
  sm_90a a tile may also be a cluster of `cluster` blocks splitting its K blocks, summed in rank
  order through distributed shared memory (narrow N at small M fills the SMs). It is the small-M
  kernel everywhere, and the whole GEMM on AMD for now.
- "lds" (gemm_a8w8_blockscale_lds.cu.j2), every FP8 target: the large-M form of "mma". A
  block of (block_m / 32) x (block_n / 32) waves, 32 x 32 each, stages each 128-wide K block of
  its A and B rows in LDS (two buffers) and every wave reads its fragments from there.
- "wgmma" (gemm_a8w8_blockscale_wgmma.cu.j2), sm_90a: block_m / 64 warpgroups, a stages-deep
  cp.async pipeline into 128-byte-swizzled shared memory, wgmma m64 n{block_n} k32.
- "gemv" (gemm_a8w8_blockscale_gemv.cu.j2), every FP8 target: decode's few rows of A, no
  matrix instructions; split_k waves per row of B stream it 16 bytes a lane, block_m rows of A
  per block (grid y takes the next), block_n rows of B per block.
- "tma" (gemm_a8w8_blockscale_tma.cu.j2), sm_90a: persistent and warp-specialized; a producer
  warp fills a stages-deep ring with tensor-memory-accelerator copies behind mbarriers, and
  block_m / 64 consumer warpgroups run the same wgmma.
"""
from __future__ import annotations

import ctypes
import json
from functools import cache
from pathlib import Path

from ..matrix import LARGE_ATOMS, Atom, atom_for
from ..spec import Variant, make_variant
from ..targets import get_target

FAMILY = "gemm_a8w8_blockscale"
TABLE_DIR = Path(__file__).resolve().parent.parent / "tables"
SCALE_BLOCK = 128
LDS_WAVE_TILE = 32   # lds kernel: M and N of one wave's tile
GEMV_UNROLL = 4     # gemv kernel: 16-byte pieces of B in flight per lane
LDS_MAX_PIECES = 8   # lds kernel: 16-byte pieces a thread may stage per K block
# tma kernel: tile N (16 and 32 give decode's few rows a tile per SM; the widths that are not
# powers of two fill the SMs better at some N)
TMA_WIDTHS = (16, 32, 56, 64, 72, 96, 112, 128, 144, 160, 192, 256)
NVIDIA_STATIC_SMEM = 48 * 1024   # static shared memory a CUDA kernel may declare
M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# (N, K) of the block-FP8 linear layers the table is tuned and benchmarked on (DeepSeek-V3's)
TUNED_SHAPES = ((2112, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384),
                (4096, 7168), (7168, 2048))

# launcher(a, b, a_scales, b_scales, out, M, N, K, lda, ldb, as_stride_m, as_stride_k,
#          bs_stride_n, bs_stride_k, stream)
ARGTYPES = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 9 + [ctypes.c_void_p]


def m_bucket(m: int) -> int:
    return next((b for b in M_BUCKETS if m <= b), M_BUCKETS[-1])


# ---- tile shapes --------------------------------------------------------------------------

def swapped(v: Variant) -> bool:
    """mma kernel: the instruction's rows are B's rows (weights) when the tile is wider in N."""
    return v["block_n"] > v["block_m"]


def mma_frags(v: Variant, atom: Atom) -> tuple[int, int]:
    """Instructions per wave along the atom's rows and columns."""
    rows, cols = (v["block_n"], v["block_m"]) if swapped(v) else (v["block_m"], v["block_n"])
    return rows // atom.rows, cols // atom.cols


def mma_registers(v: Variant, atom: Atom, prefetch: bool, scales: bool) -> int:
    """Estimated registers per lane: accumulators, one or two K blocks of fragments (with
    scales: each with its scales, as the template's PREFETCH holds them), 32 more."""
    fr, fc = mma_frags(v, atom)
    frags = 4 * (fr * len(atom.a_rows) + fc) * (128 // atom.pair_k)
    if scales:
        tokens = {col if swapped(v) else row for row, col in atom.c}   # distinct A scales
        frags += (fc if swapped(v) else fr) * len(tokens) + 1
    return 2 * fr * fc * len(atom.c) + frags * (2 if prefetch else 1) + 32


def mma_prefetch_fits(v: Variant, atom: Atom) -> bool:
    """Whether the next K block's fragments fit in registers too (stages=2)."""
    return mma_registers(v, atom, prefetch=True, scales=True) <= register_budget(v) * 3 // 4


def mma_min_blocks(v: Variant, atom: Atom) -> int:
    """sm_90a, one K block in registers: the blocks per SM __launch_bounds__ asks for where a
    tile's fragments fit in 64 registers (8 x 16 tiles; left alone, nvcc takes about 80 and, at
    512 threads, halves the blocks an SM holds); 0: none."""
    if v.target.vendor != "nvidia" or v["stages"] != 1:
        return 0
    if mma_registers(v, atom, prefetch=False, scales=False) > 64:
        return 0
    return v.target.regs_per_simd // (block_threads(v) * 64)


def mma_register_cap(v: Variant, atom: Atom) -> int:
    """The registers a lane may take under mma_min_blocks' bound (0: no bound): 64 at 512
    threads, 72 at split_k 14's 448 (allocated in eights)."""
    blocks = mma_min_blocks(v, atom)
    return v.target.regs_per_simd // (block_threads(v) * blocks) // 8 * 8 if blocks else 0


def mma_reduce_bytes(v: Variant, atom: Atom) -> int:
    fr, fc = mma_frags(v, atom)
    return 0 if v["split_k"] == 1 else v["split_k"] * fr * fc * len(atom.c) * atom.wave * 4


LDS_WAVE_TILES = {"": (LDS_WAVE_TILE, LDS_WAVE_TILE), "w64x32": (64, 32), "w64x64": (64, 64)}


def lds_wave_tile(v: Variant) -> tuple[int, int]:
    """lds kernel: one wave's tile, rows of A by rows of B."""
    return LDS_WAVE_TILES[v["wave_tile"]]


def lds_waves(v: Variant) -> tuple[int, int]:
    """lds kernel: waves along M and N."""
    tm, tn = lds_wave_tile(v)
    return v["block_m"] // tm, v["block_n"] // tn


def wave_instructions_per_kblock(v: Variant, atom: Atom) -> int:
    """Matrix instructions one wave issues per 128-wide K block (mma and lds kernels)."""
    if v["kernel"] == "lds":
        rows, cols = lds_wave_tile(v)
    else:
        rows, cols = (v["block_n"], v["block_m"]) if swapped(v) else (v["block_m"], v["block_n"])
    return (rows // atom.rows) * (cols // atom.cols) * (SCALE_BLOCK // atom.k)


def loop_estimate(v: Variant, asm: str):
    """The static K-loop estimate (codegen/build/estimate.py) of an AMD mma / lds variant from
    its assembly, or None (other kernels, other targets, no loop found)."""
    from ..build.estimate import estimate

    if not v.target.is_hip or v["kernel"] not in ("mma", "lds"):
        return None
    atom = atom_for(v.arch, v["kernel"], v["atom"])
    if atom is None or not atom.cycles:
        return None
    t = v.target
    return estimate(asm, {atom.mnemonic: atom.cycles}, wave_instructions_per_kblock(v, atom),
                    t.wave_size, (t.lds_read_per_clk / t.simds_per_cu,
                                  t.lds_write_per_clk / t.simds_per_cu))


def lds_smem_bytes(v: Variant) -> int:
    return 2 * (v["block_m"] + v["block_n"]) * SCALE_BLOCK


def lds_stage_offset(row: int, col: int) -> int:
    """lds kernel: where byte col of staged row `row` lies in a stage buffer (the template's
    `at`): 128-byte rows, 16-byte piece col / 16 stored as piece col / 16 ^ row % 8."""
    return row * SCALE_BLOCK + (col ^ ((row & 7) << 4))


def lds_pieces(v: Variant) -> int:
    """lds kernel: 16-byte pieces each thread stages per K block (A's and B's rows apart)."""
    threads = block_threads(v)
    return sum(-(-rows * SCALE_BLOCK // 16 // threads) for rows in (v["block_m"], v["block_n"]))


def lds_registers(v: Variant, atom: Atom) -> int:
    """Estimated registers per lane: accumulators and partial sums, a K block's fragments, the
    staging loads in flight (4 each, 2 more for their addresses), the scales, 32 more."""
    tm, tn = lds_wave_tile(v)
    fr, fc = tm // atom.rows, tn // atom.cols
    pieces = lds_pieces(v)
    frags = atom.chunk // 4 * (fr * len(atom.a_rows) + fc) * (SCALE_BLOCK // atom.pair_k)
    return 2 * fr * fc * len(atom.c) + frags + 6 * pieces + fr * len(atom.c) + 1 + 32


def wgmma_smem_bytes(v: Variant) -> int:
    """wgmma and tma kernels: the stages and 1024 bytes of alignment; tma's output tile (bf16)
    and two mbarriers per stage."""
    bm, bn = v["block_m"], v["block_n"]
    extra = bm * bn * 2 + 16 * v["stages"] if v["kernel"] == "tma" else 0
    return v["stages"] * (bm + bn) * SCALE_BLOCK + 1024 + extra


def tma_staged_bytes(v: Variant) -> int:
    """tma kernel: the shared memory its staged build adds (A's column-major scales of each
    stage, aligned to 128; narrow tiles, whose K steps are shorter than a scale load's trip from
    L2), 0 where it has none."""
    narrow = v["kernel"] == "tma" and v["block_n"] <= 64 and not tma_one_set(v)
    return 128 + v["stages"] * v["block_m"] * 4 if narrow else 0


def tma_straddles(bn: int) -> list[int]:
    """tma kernel: the tile columns at which a tile of width bn (starting at a multiple of bn)
    may cross into the next 128-column weight-scale block."""
    if SCALE_BLOCK % bn == 0:
        return []
    cols = {SCALE_BLOCK - n0 % SCALE_BLOCK for n0 in range(0, bn * SCALE_BLOCK, bn)}
    return sorted(c for c in cols if c < bn)


def tma_one_set(v: Variant) -> bool:
    """tma kernel: one partial-sum set per consumer warpgroup, each K block's MMAs waited for
    before their scaling (256 rows: two waves' results; over 128 columns: two sets of m64 x BN
    partial sums and the result take more than a consumer's registers)."""
    return v["block_m"] == 256 or v["block_n"] > 128


def block_threads(v: Variant) -> int:
    if v["kernel"] == "wgmma":
        return 128 * (v["block_m"] // 64)
    if v["kernel"] == "tma":   # a producer warpgroup and block_m / 64 consumers (2 at 256 rows)
        return 128 * (1 + min(v["block_m"] // 64, 2))
    if v["kernel"] == "lds":
        wm, wn = lds_waves(v)
        return wm * wn * v.target.wave_size
    if v["kernel"] == "gemv":
        return v["block_n"] * v["split_k"] * v.target.wave_size
    return v["split_k"] * v.target.wave_size


def register_budget(v: Variant, acc: bool = False) -> int:
    """Registers a lane may hold with the block resident at all: NVIDIA's 64K per SM shared by
    the block's threads (at most 255 each); AMD's VGPR file per SIMD shared by the block's waves
    on that SIMD (at most 256 architected VGPRs each; acc: CDNA's 256 accumulation VGPRs too,
    where the compiler may keep MFMA accumulators and operands)."""
    t, threads = v.target, block_threads(v)
    if t.vendor == "nvidia":
        return min(255, t.regs_per_simd // threads // 8 * 8)
    waves_per_simd = -(-threads // t.wave_size // t.simds_per_cu)
    cap = 512 if acc and t.matrix_fp8.startswith("mfma") else 256
    return min(cap, t.regs_per_simd // waves_per_simd // t.reg_granule * t.reg_granule)


def validate(v: Variant) -> str | None:
    t, bm, bn = v.target, v["block_m"], v["block_n"]
    if v["cluster"] != 1 and (v["kernel"] not in ("tma", "mma") or t.arch != "sm_90a"):
        return (f"cluster={v['cluster']} is an sm_90a option of the tma kernel (TMA multicast) "
                f"and the mma kernel (split K), not of {v['kernel']} on {t.arch}")
    if v["l2_first_pass"] and (v["kernel"] != "mma" or t.arch != "sm_90a"):
        return (f"l2_first_pass is an sm_90a option of the mma kernel, not of {v['kernel']} on "
                f"{t.arch}")
    if v["kernel"] in ("wgmma", "tma"):
        kernel = v["kernel"]
        if t.arch != "sm_90a":
            return f"kernel={kernel} needs sm_90a (warpgroup MMA)"
        widths = (64, 128) if kernel == "wgmma" else TMA_WIDTHS
        heights = (64, 128) if kernel == "wgmma" else (64, 128, 256)
        if bm not in heights or bn not in widths:
            return (f"{kernel} tiles are {', '.join(map(str, heights[:-1]))} or {heights[-1]} in M "
                    f"and {widths} in N, not {bm}x{bn}")
        if v["cluster"] not in (1, 2):
            return f"tma cluster={v['cluster']} is not 1 or 2"
        if bm == 256 and v["cluster"] != 1:
            return "tma tiles of 256 rows are built without clusters"
        if bm == 256 and bn > 128:   # two waves' results and a partial-sum set: 3 x bn / 2 registers
            return f"tma tiles of 256 rows are at most 128 wide, not {bn} (consumer registers)"
        if bn == 256 and (bm != 128 or v["cluster"] != 1):   # two consumers side by side
            return f"tma tiles 256 wide are 128 high and built without clusters, not {bm}x{bn} c{v['cluster']}"
        if kernel == "tma" and (bn // v["cluster"]) % 8:
            return f"tma cluster={v['cluster']} splits the {bn}-row B box into slices of whole 8-row groups"
        least = 3 if kernel == "wgmma" else 2
        if v["split_k"] != 1 or v["stages"] < least:
            return f"{kernel} takes split_k=1 and {least} or more stages"
        smem = wgmma_smem_bytes(v) + tma_staged_bytes(v)
        if smem > t.lds_bytes:
            return f"{smem} bytes of shared memory exceed {t.lds_bytes}"
        return None
    if v["wave_tile"] and v["kernel"] != "lds":
        return f"wave_tile={v['wave_tile']} is an lds-kernel option"
    if v["kernel"] == "gemv":
        return validate_gemv(v)
    atom = atom_for(t.arch, v["kernel"], v["atom"])
    if atom is None and v["atom"]:
        return f"atom={v['atom']} is an lds-kernel instruction {t.arch} does not have"
    if atom is None:
        return f"no FP8 matrix instruction known for {t.arch}"
    if v["kernel"] == "lds":
        return validate_lds(v, atom)
    if v["stages"] not in (1, 2):
        return (f"kernel=mma holds 1 or 2 K blocks of fragments in registers (stages), "
                f"not {v['stages']}")
    rows, cols = (bn, bm) if swapped(v) else (bm, bn)
    if rows % atom.rows or cols % atom.cols:
        return (f"tile {bm}x{bn} does not split into {atom.rows}x{atom.cols} instructions "
                f"({'B' if swapped(v) else 'A'} rows on the instruction's M)")
    if v["cluster"] not in (1, 2, 4, 8):
        return f"mma cluster={v['cluster']} is not 1, 2, 4 or 8 (blocks per tile, portable size)"
    if v["split_k"] * atom.wave > 1024:
        return f"split_k={v['split_k']} waves of {atom.wave} exceed 1024 threads"
    # nvcc hoists the next K block's loads even without PREFETCH: count them there
    hoisted = t.vendor == "nvidia"
    regs = mma_registers(v, atom, prefetch=hoisted, scales=hoisted and v["stages"] == 2)
    if regs > register_budget(v):
        return f"about {regs} registers per lane, over the budget of {register_budget(v)}"
    if v["stages"] == 2 and not mma_prefetch_fits(v, atom):
        return (f"stages=2 (two K blocks of fragments) takes about "
                f"{mma_registers(v, atom, prefetch=True, scales=True)} registers per lane, over "
                f"3/4 of the budget of {register_budget(v)}")
    if mma_reduce_bytes(v, atom) > t.lds_bytes:
        return f"{mma_reduce_bytes(v, atom)} bytes of LDS for the split-K sum exceed {t.lds_bytes}"
    return None


def validate_gemv(v: Variant) -> str | None:
    if not v.target.has_fp8:
        return f"no FP8 matrix instruction known for {v.target.arch}"
    if v["block_m"] > 4 or v["block_n"] > 8:
        return f"kernel=gemv takes at most 4 rows of A and 8 of B per block, not {v['block_m']}x{v['block_n']}"
    if v["stages"] != 1 or v["atom"]:
        return "kernel=gemv has no pipeline nor matrix instruction (stages=1, atom='')"
    if block_threads(v) > 1024:
        return f"{block_threads(v)} threads per block exceed 1024"
    # each A row adds its pieces in flight and their decoded values (fitted to nvcc's counts:
    # 64 / 106 / 156 registers at 1 / 2 / 4 rows)
    regs = 20 + 44 * v["block_m"]
    if regs > register_budget(v):
        return f"about {regs} registers per lane, over the budget of {register_budget(v)}"
    return None


def validate_lds(v: Variant, atom: Atom) -> str | None:
    t, bm, bn = v.target, v["block_m"], v["block_n"]
    tm, tn = lds_wave_tile(v)
    if bm % tm or bn % tn:
        return f"kernel=lds tiles are multiples of {tm} in M and {tn} in N, not {bm}x{bn}"
    if (tm, tn) == (64, 64) and atom.rows != 16:
        # 320+ registers, fragments staged from AGPRs, which the emulator's DS stores do not
        # read (unverified), for no estimated gain over the 16-row forms
        return f"wave_tile=w64x64 takes a 16-row instruction, not {atom.name}"
    if v["split_k"] != 1 or v["stages"] != 2:
        return "kernel=lds takes split_k=1 and stages=2 (two LDS buffers)"
    if block_threads(v) > 1024:
        return f"{block_threads(v)} threads per block exceed 1024"
    if lds_pieces(v) > LDS_MAX_PIECES:   # nvcc spilled at 10-12 with every other register taken
        return (f"{lds_pieces(v)} staged 16-byte pieces per thread and K block (more than "
                f"{LDS_MAX_PIECES}): too few waves for the tile")
    limit = min(t.lds_bytes, NVIDIA_STATIC_SMEM) if t.vendor == "nvidia" else t.lds_bytes
    if lds_smem_bytes(v) > limit:
        return f"{lds_smem_bytes(v)} bytes of LDS exceed {limit}"
    regs, budget = lds_registers(v, atom), register_budget(v, acc=True)
    if regs > budget:
        return f"about {regs} registers per lane, over the budget of {budget}"
    return None


def tma_wgmma_n(v: Variant) -> int:
    """tma kernel: a consumer warpgroup's columns (its wgmma's n); 256-wide tiles put the two
    side by side."""
    return v["block_n"] // 2 if v["block_n"] == 256 else v["block_n"]


def context(v: Variant) -> dict:
    ctx = dict(block_m=v["block_m"], block_n=v["block_n"], block=block_threads(v))
    if v["kernel"] in ("wgmma", "tma"):
        wn = tma_wgmma_n(v) if v["kernel"] == "tma" else v["block_n"]
        return dict(ctx, stages=v["stages"], smem_bytes=wgmma_smem_bytes(v), wgmma_n=wn,
                    straddles=tma_straddles(wn), cluster=v["cluster"],
                    one_set=v["kernel"] == "tma" and tma_one_set(v),
                    staged_scales=tma_staged_bytes(v) > 0)
    if v["kernel"] == "gemv":
        return dict(ctx, split_k=v["split_k"], unroll=GEMV_UNROLL)
    atom = atom_for(v.arch, v["kernel"], v["atom"])
    if v["kernel"] == "lds":
        wm, wn = lds_waves(v)
        return dict(ctx, atom=atom, wm=wm, wn=wn)
    fr, fc = mma_frags(v, atom)
    return dict(ctx, atom=atom, fr=fr, fc=fc, split_k=v["split_k"], swap=swapped(v),
                prefetch=v["stages"] == 2, min_blocks=mma_min_blocks(v, atom),
                cluster=v["cluster"], l2_first_pass=v["l2_first_pass"])


# ---- configs and dispatch -----------------------------------------------------------------

def config(kernel: str, block_m: int, block_n: int, split_k: int = 1, stages: int = 1,
           atom: str = "", wave_tile: str = "", cluster: int = 1,
           l2_first_pass: bool = False) -> dict:
    return dict(kernel=kernel, block_m=block_m, block_n=block_n, block_k=SCALE_BLOCK,
                split_k=split_k, stages=stages, atom=atom, wave_tile=wave_tile, cluster=cluster,
                l2_first_pass=l2_first_pass)


def mma_config(arch: str, block_m: int, block_n: int, split_k: int = 1, cluster: int = 1) -> dict:
    """An mma config holding the next K block's fragments too where they fit (stages=2)."""
    two = config("mma", block_m, block_n, split_k=split_k, stages=2, cluster=cluster)
    fp8 = get_target(arch).fp8_formats[0].token
    return two if validate(make_variant(FAMILY, arch, fp8=fp8, **two)) is None else \
        {**two, "stages": 1}


def padded_k(k: int) -> int:
    """K as the kernels read it, a multiple of 16 (rows are read 16 bytes at a time): the op
    copies A and B into zero-padded rows of this length where K is not one. The zero columns
    add nothing to any sum, and the scales' ceil(K / 128) blocks stay as they are."""
    return -(-k // 16) * 16


# CDNA's 128 x 128 tile: its instruction and wave tile where they are not the default
# instruction in 64 x 32 wave tiles (the estimate's fastest K loop at two waves a SIMD)
CDNA_LARGE_TILE = {"gfx950": dict(atom="16x16x128", wave_tile="w64x64")}


def gemv_config(arch: str, split: int) -> dict:
    """The decode kernel with `split` waves a row of B, a block of up to 8 rows (512 threads at
    4 waves a row; 256 on gfx12)."""
    return config("gemv", 1, min(8, (16 if arch == "sm_90a" else 8) // split), split_k=split)


def gemv_split(arch: str, n: int | None, k: int | None, cus: int | None = None) -> int:
    """Waves a row of B for decode: more fill the device at small N (512 threads a
    multiprocessor), fewer give each lane the GEMV_UNROLL pieces it keeps in flight (on the
    H100 one warp a row beat four by 1.1-3x at N >= 3000). 4 where N or K is not known."""
    t = get_target(arch)
    if n is None or k is None:
        return 4
    by_k = k // 16 // (GEMV_UNROLL * t.wave_size)
    by_fill = -(-(cus or t.multiprocessors) * 512 // (n * t.wave_size))
    waves = min(by_k, by_fill)
    return 4 if waves >= 3 else 2 if waves >= 2 else 1


def heuristic(arch: str, m: int, n: int | None = None, cus: int | None = None,
              k: int | None = None) -> dict:
    """The config for a shape no table entry covers, valid for any N and K: by M, at M = 1 by N
    and K, and on CDNA by whether 128 x 128 tiles of the output fill the device's `cus`
    multiprocessors (the target's largest part where not given; without N, as if they do)."""
    if m == 1:   # decode: stream the weights, no matrix instructions (but short rows on sm_90a)
        if arch == "sm_90a" and k and k <= 1536 and (n or 0) >= 4096:
            kblocks = -(-k // SCALE_BLOCK)   # the mma kernel's split-K: 1.3-1.7x gemv's pace
            return mma_config(arch, 8, 16, split_k=4 if kblocks >= 4 else 2 if kblocks >= 2 else 1)
        return gemv_config(arch, gemv_split(arch, n, k, cus))
    if arch == "sm_90a":
        if m <= 8:
            return mma_config(arch, 8, 32, split_k=8)
        if m <= 16:
            return mma_config(arch, 16, 32, split_k=8)
        if m <= 128:
            return config("wgmma", 64, 64, stages=6)
        return config("tma", 128, 128, stages=5)
    if m <= 16:
        return mma_config(arch, 16, 16, split_k=8)
    target = get_target(arch)
    if target.wave_size == 32:
        # RDNA: 8 waves of 32 x 32 (not measured on a GPU yet; by the estimate 64 x 64,
        # 64 x 128 and 128 x 64 tie: the tuner decides)
        return config("lds", 128, 64, stages=2)
    # CDNA, as AMD's own tuned block-scale GEMMs for these layers pick (CK on MI300X / MI355X:
    # 128 x 128 tiles at large M, 64 x 64 where those leave CUs idle), in wave tiles that keep
    # two waves a SIMD to hide memory latency: gfx942 eight of 64 x 32; gfx950 four of 64 x 64
    # on 16x16x128 (254 registers: two blocks a CU), whose K loop takes 0.8x the cycles of
    # two 64 x 32 waves on a SIMD by the static estimate (those wait on LDS).
    tiles = -(-m // 128) * -(-(n or 1 << 30) // 128)
    if tiles < (cus or target.multiprocessors):
        return config("lds", 64, 64, stages=2)
    return config("lds", 128, 128, stages=2,
                  **CDNA_LARGE_TILE.get(arch, dict(atom="", wave_tile="w64x32")))


def default_configs(arch: str) -> list[dict]:
    """What a build compiles besides the table: the heuristic's picks, and the large-M tile on
    each larger instruction the target has, some with the 64 x 32 wave tile too (for python -m
    codegen.tune on its GPU; the static estimate ranks them)."""
    # N = 128 gives the fewest 128 x 128 tiles, no N as many as fill any device: both CDNA picks
    picks = [heuristic(arch, m, n) for m in M_BUCKETS for n in (128, None)]
    picks += [gemv_config(arch, split) for split in (1, 2)]   # decode with N and K known
    if arch == "sm_90a":   # its decode on short rows
        picks += [heuristic(arch, 1, 4096, k=k) for k in (128, 256, 512)]
    larger = [value for value, (_, archs) in LARGE_ATOMS.items() if arch in archs]
    picks += [config("lds", 128, 64, stages=2, atom=value) for value in larger]
    if get_target(arch).wave_size == 64:
        # CDNA: the 64 x 32 wave tile (4 waves of 64) on the default instruction and on CDNA4's
        # 32-byte f8f6f4 ones. On 32x32x16 it takes 264 registers (A operands in AGPRs, one
        # wave per SIMD), estimated slower than the default instruction's.
        wide = ["", *(v for v in larger if atom_for(arch, "lds", v).lane_bytes == 32)]
        picks += [config("lds", 128, 64, stages=2, atom=v, wave_tile="w64x32") for v in wide]
    return [c for i, c in enumerate(picks) if c not in picks[:i]]


def table_path(arch: str) -> Path:
    return TABLE_DIR / f"{FAMILY}.{arch}.json"


def table_entries(path) -> dict[tuple[int, int, int], dict]:
    """(M bucket, N, K) -> entry of a table file, in its order ({} when there is none)."""
    path = Path(path)
    if not path.exists():
        return {}
    return {(e["m"], e["n"], e["k"]): e for e in json.loads(path.read_text())["entries"]}


@cache
def table(arch: str) -> dict[tuple[int, int, int], dict]:
    """(M bucket, N, K) -> config, from the tuned table in the repo (empty when none)."""
    # entries written before an axis existed take its default
    return {key: {**config("mma", 1, 1), **e["config"]}
            for key, e in table_entries(table_path(arch)).items()}


def pick(arch: str, m: int, n: int, k: int, cus: int | None = None) -> dict:
    """The table's entry for the cell, else the heuristic's (cus: the device's multiprocessors)."""
    return table(arch).get((m_bucket(m), n, k)) or heuristic(arch, m, n, cus, k)


def variants(target) -> list[Variant]:
    """The variants a build compiles for a target: the table's configs and the defaults."""
    if not target.has_fp8:
        return [make_variant(FAMILY, target.arch, fp8="none", **config("mma", 16, 16))]
    configs = default_configs(target.arch)
    for c in table(target.arch).values():
        if c not in configs:
            configs.append(c)
    return [make_variant(FAMILY, target.arch, fp8=fp8_token(target, f.name), **c)
            for f in target.fp8_formats if f.token == fp8_token(target, f.name)
            for c in configs]


def fp8_token(target, name: str) -> str:
    """The GEMM reads fp8 bytes as they are: one variant per format, whatever the max."""
    return next(f.token for f in target.fp8_formats if f.name == name)
