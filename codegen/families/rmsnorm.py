"""RMSNorm: decisions for rmsnorm.cu.j2, shared by the fused RMSNorm + FP8 quant families.

Layout (see templates/include/codegen/rmsnorm.cuh, Items): a row is cut into chunks of 8 elements
for every dtype; TPR threads share a row, thread r owning chunks r, r + TPR, ..., or, in tiers of
at most 256 threads with an even ITEMS, pairs of chunks 8 apart (a 128-element quant group in 8
lanes instead of 16). The kernel for a row length is picked at run time by the launcher from the
tier table below: the first tier whose register capacity (TPR * ITEMS chunks) holds the row, else
the last one, which reads the row twice (the second read hits L2).

The rounding of a row's sum of squares depends only on H and the tier, so the table is the same
for every dtype and every family, up to ITEMS in the 1024-thread tiers (whose layout does not
depend on it): fp32 rmsnorm then sums exactly like the bf16 / fp16 kernels, and the fused kernels
like the unfused ones (the parity tests check both bit for bit).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from typing import Callable

from ..spec import Variant

# dtype -> (template KIND, bytes per element)
DTYPES = {"bf16": (0, 2), "fp16": (1, 2), "fp32": (2, 4)}
CHUNK = 8                 # elements per chunk, every dtype
MAX_BLOCK = 1024
HEAVY_BLOCK = 256         # block of the tiers holding the most registers


@dataclass(frozen=True)
class Tier:
    tpr: int              # threads per row
    items: int            # chunks per thread held in registers
    block: int            # threads per block (block / tpr rows per block)
    two_pass: bool = False
    split: int = 1        # sums as the tier of tpr * split threads, items / split chunks each

    @property
    def cap(self) -> int:
        """Longest row (in chunks) this tier holds in registers."""
        return self.tpr * self.items


@cache
def tiers(dtype: str, wave: int) -> tuple[Tier, ...]:
    """Row-length tiers, shortest first; the last one takes every longer row.

    - 16 threads per row, 16 rows per 256-thread block: H <= 256 (e.g. per-head q/k norms);
    - a wave per row, 4 chunks per lane: H <= 2048 (wave64) / 1024 (wave32);
    - wave32: 128 threads (four waves) per row, 2 chunks each, up to H = 2048 (DeepSeek's q_a
      norm is 1536). Paired items put a 128-element quant group in 8 lanes; two waves holding 3
      unpaired chunks each spent twice the shuffles and scale divisions per element. H200, bf16,
      H = 1536, graph time at T = 1 / 16 / 256 / 4096 / 16384 against 64 threads x 3 chunks:
      rmsnorm_group_quant 1.82 / 2.52 / 2.76 / 10.0 / 30.7 -> 1.43 / 2.07 / 2.42 / 8.88 / 27.5
      us, fused_add_rmsnorm 1.76 / 2.43 / 2.87 / 14.3 / 50.3 -> 1.62 / 2.22 / 2.79 / 14.1 / 50.1,
      rmsnorm 1.46 / 1.94 / 2.23 / 7.24 / 26.1 -> 1.35 / 1.90 / 2.22 / 7.77 / 26.9. A wave per
      row with 6 chunks per lane: rmsnorm_group_quant 2.15 / 2.99 / 3.20 / 9.84 / 27.4,
      fused_add_rmsnorm 2.30 / 3.28 / 3.72 / 15.9 / 53.6 (and 8 chunks per lane was slower at
      small T still);
    - 256 threads per row, 2 chunks each: H <= 4096. The 4-chunk kernel of the next tier would
      take these rows at the same sum order, but its registers cost occupancy, and so loads in
      flight (H200, bf16, 2 chunks against 4: rmsnorm 16384 x 4096 79 -> 72 us, 16384 x 3072
      70 -> 60 us; rmsnorm_group_quant 16384 x 4096 99 -> 85 us);
    - 256 threads per row, 4 chunks each: H <= 8192;
    - 1024 threads, one row per block, 2 chunks each: H <= 16384, for 16-bit types only (2 chunks
      keep a 1024-thread block within sm_90's 64 registers per thread; fp32 could hold only one,
      no more than the tier before);
    - the same 1024 threads per row, reading the row twice: any longer row.
    """
    big = 2 if DTYPES[dtype][1] == 2 else 1
    table = [Tier(16, 2, 256), Tier(wave, 4, 256), Tier(128, 2, 256), Tier(64, 4, 256),
             Tier(256, 2, 256), Tier(256, 4, 256),
             Tier(MAX_BLOCK, big, MAX_BLOCK)]
    out: list[Tier] = []
    for t in table:
        if not out or t.cap > out[-1].cap:
            out.append(t)
    out.append(Tier(MAX_BLOCK, big, MAX_BLOCK, two_pass=True))
    return tuple(out)


def staging(target, residual: bool) -> tuple[int, Callable[[Tier], bool]]:
    """(STAGES, which one-pass tiers use it) of rmsnorm.cu.j2: rows streamed through shared
    memory by rmsnorm_rows_staged (rmsnorm.cuh), STAGES - 1 of them in flight while one is
    normalized; the launcher takes it only for grids larger than fit on the device at once (a
    block with one row group has nothing to overlap). On sm_90a (cp.async), measured on the
    H200: plain rmsnorm gains with 1024-thread rows (4096 x 16384: 106 -> 80 us) and loses a
    little elsewhere. fused_add_rmsnorm gains nowhere since its register kernel issues all of a
    thread's loads before its first residual store (16384 x 1536: 57 against 55 us, 16384 x 4096:
    145 against 139, 16384 x 16384: 555 against 528). AMD keeps the register path: a copy into
    LDS there is a plain load and store (gfx942 has no 16-byte asynchronous global -> LDS copy),
    and its speed cannot be measured here."""
    if target.is_hip or residual:
        return 0, lambda t: False
    return 3, lambda t: not t.two_pass and t.tpr == MAX_BLOCK


def tier_for(h: int, dtype: str, wave: int, table: tuple[Tier, ...] | None = None) -> Tier:
    """The tier the launcher picks for rows of h elements (the template's rule, for tests)."""
    chunks = -(-h // CHUNK)
    table = table or tiers(dtype, wave)
    return next((t for t in table[:-1] if chunks <= t.cap), table[-1])


def chunk_map(t: Tier) -> list[list[int]]:
    """The chunks of a row each thread sums, in its order: rmsnorm.cuh's Items, as threads of
    the tier a split tier sums as (item i of thread r is thread r + part(i) tpr's)."""
    paired = t.tpr <= 256 and t.items % 2 == 0

    def chunk(r: int, i: int) -> int:
        if not paired:
            return i * t.tpr + r
        return (r & ~7) * 2 + (r & 7) + i // 2 * 2 * t.tpr + i % 2 * 8

    def part(i: int) -> int:
        return (i // 2 if paired else i) % t.split

    return [[chunk(r, i) for i in range(t.items) if part(i) == k]
            for k in range(t.split) for r in range(t.tpr)]


def tier_context(dtype: str, wave: int, tpg: int = 1, table: list[Tier] | None = None,
                 staged: Callable[[Tier], bool] = lambda t: False) -> dict:
    """The tier table as the templates read it (tpg: lanes per quant group, must divide TPR;
    staged: the tiers that stream rows through shared memory)."""
    table = table or tiers(dtype, wave)
    assert all(t.tpr % tpg == 0 and t.block % t.tpr == 0 for t in table)
    rows = [dict(tpr=t.tpr, per_thread=t.items, block=t.block, cap=t.cap, split=t.split,
                 two_pass=str(t.two_pass).lower(), staged=str(staged(t)).lower())
            for t in table]
    # "block" feeds the manifest's occupancy figure, which is computed from the module's largest
    # register count over its kernels: that of a 256-thread tier (the 1024-thread tiers hold at
    # most 2 chunks per thread and are capped by their launch bounds).
    return dict(tiers=rows, block=HEAVY_BLOCK)


# launcher(x, residual, residual_out, weight, y, rows, h, x_row_stride_bytes,
#          residual_row_stride_bytes, residual_out_row_stride_bytes, eps, stream)
# residual may be null, residual_out null for in place.
ARGTYPES = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_float, ctypes.c_void_p]


def validate(v: Variant) -> str | None:
    return None


def context(v: Variant) -> dict:
    kind, _ = DTYPES[v["dtype"]]
    n, staged = staging(v.target, v["residual"])
    return dict(kind=kind, vector=str(v["load"] == "vec16").lower(),
                residual=str(v["residual"]).lower(), stages=n,
                **tier_context(v["dtype"], v.target.wave_size, staged=staged))
