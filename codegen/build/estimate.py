"""A static estimate of an AMD GEMM variant's K loop, from its assembly: what one wave spends per
128-wide K block on matrix instructions, on issuing everything else, and on LDS bandwidth; the
largest of the three bounds the loop. The tuner uses it to time candidates best-first
(codegen/tune.py); the manifest carries it (codegen/build/aot.py).

Per wave and K block:
- matrix cycles: each matrix instruction's issue-to-issue cycles on one SIMD (Atom.cycles);
- issue cycles: a VALU instruction takes 4 cycles for wave64 (16 lanes a cycle on CDNA) and 1
  for wave32 (RDNA's 32-lane SIMD); SALU, memory and LDS instructions 1 issue each;
- LDS cycles: the bytes the wave reads from and writes to LDS at its SIMD's share of the
  target's read and write rates (shared by the 4 SIMDs of a CU or WGP; codegen/targets.py).
The loop is the innermost one LLVM's loop comments mark around the matrix instructions; blocks
inside it that run only on some iterations (tails) count in full, so the estimate leans high.
It is a ranking aid, not a timing: it ignores latency, occupancy and memory stalls (the tuner
adds the grid: `predicted_cycles`).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# a block: ".LBB0_3:" when branched to, "; %bb.2:" when only fallen into; loop comments follow
_LABEL = re.compile(r"^(?:\.L(BB\d+_\d+)|;\s*%bb\.\d+):\s*(?:;\s*(.*))?$")
_HEADER = re.compile(r"Loop Header: Depth=(\d+)")
_MEMBER = re.compile(r"in Loop: Header=(BB\d+_\d+) Depth=(\d+)")
_LDS_BYTES = {"b128": 16, "b96": 12, "b64": 8, "b32": 4, "u16": 2, "i16": 2, "b16": 2, "u8": 1,
              "i8": 1, "b8": 1}
_LDS_WRITES = ("ds_write", "ds_store")
# waits and scheduling hints; gfx12 splits s_waitcnt into s_wait_loadcnt, s_wait_dscnt, ... and
# s_wait_alu (the dependency-counter wait)
_NO_ISSUE = ("s_waitcnt", "s_wait_", "s_barrier", "s_nop", "s_setprio", "s_sleep", "s_delay_alu")


@dataclass(frozen=True)
class LoopEstimate:
    matrix_cycles: float      # per wave and 128-wide K block
    issue_cycles: float
    lds_cycles: float
    bound: str                # "matrix", "issue" or "lds": the largest
    matrix_fraction: float    # matrix_cycles / the largest: the share of the matrix rate reached

    @property
    def cycles(self) -> float:
        return max(self.matrix_cycles, self.issue_cycles, self.lds_cycles)

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def loop_bodies(asm: str) -> dict[str, tuple[int, list[str]]]:
    """Loop header -> (depth, instruction mnemonics of the blocks LLVM marks as in that loop)."""
    loops: dict[str, tuple[int, list[str]]] = {}
    current = None
    for line in asm.splitlines():
        s = line.strip()
        if s.startswith(".amdgpu_metadata"):
            break
        m = _LABEL.match(s)
        if m:
            label, comment = m.group(1) or "", m.group(2) or ""
            h, member = _HEADER.search(comment), _MEMBER.search(comment)
            current = ((label, int(h.group(1))) if h else
                       (member.group(1), int(member.group(2))) if member else None)
            if current:
                loops.setdefault(current[0], (current[1], []))
            continue
        if current and s and not s.startswith((";", ".")) and not s.endswith(":"):
            loops[current[0]][1].append(s.split()[0])
    return loops


def _lds_bytes(op: str) -> int:
    per = next((b for suffix, b in _LDS_BYTES.items() if op.endswith(suffix)), 4)
    return per * (2 if op.startswith(("ds_read2", "ds_write2", "ds_load_2", "ds_store_2")) else 1)


def estimate(asm: str, matrix_cycles: dict[str, int], per_kblock: int, wave: int,
             lds_rates: tuple[float, float]) -> LoopEstimate | None:
    """The K loop's estimate. matrix_cycles: cycles of each matrix mnemonic the kernel may use;
    per_kblock: matrix instructions a wave issues per K block; lds_rates: one SIMD's share of the
    LDS read and write bytes per cycle. None when no loop holds them."""
    best = None
    for depth, ops in loop_bodies(asm).values():
        n = sum(op in matrix_cycles for op in ops)
        if n and (best is None or (n, depth) > (best[0], best[1])):
            best = (n, depth, ops)
    if best is None:
        return None
    n, _, ops = best
    kblocks = n / per_kblock
    matrix = sum(matrix_cycles.get(op, 0) for op in ops)
    valu = sum(op.startswith("v_") and op not in matrix_cycles for op in ops)
    other = sum(op.startswith(("s_", "ds_", "global_", "buffer_", "flat_", "scratch_"))
                and not op.startswith(_NO_ISSUE) for op in ops)
    issue = valu * (4 if wave == 64 else 1) + other
    written = sum(_lds_bytes(op) for op in ops if op.startswith(_LDS_WRITES))
    read = sum(_lds_bytes(op) for op in ops if op.startswith("ds_")) - written
    lds = wave * (read / lds_rates[0] + written / lds_rates[1])
    parts = {"matrix": matrix / kblocks, "issue": issue / kblocks, "lds": lds / kblocks}
    bound = max(parts, key=parts.get)
    return LoopEstimate(parts["matrix"], parts["issue"], parts["lds"], bound,
                        parts["matrix"] / parts[bound])


def predicted_cycles(cycles_per_kblock: float, m: int, n: int, k: int, block_m: int,
                     block_n: int, split_k: int, waves_per_block: int, blocks_per_cu: int,
                     simds_per_cu: int, cus: int) -> float:
    """Cycles of the whole GEMM from the loop estimate: the blocks run in rounds of what the
    device holds at once (blocks_per_cu: the occupancy); in a round each SIMD works through its
    waves' K blocks one after another (its matrix unit, issue slots and LDS share are its own)."""
    blocks = -(-m // block_m) * -(-n // block_n) * split_k
    per_cu = max(1, blocks_per_cu)
    rounds = -(-blocks // (per_cu * cus))
    last = blocks - (rounds - 1) * per_cu * cus

    def waves_on_simd(blocks_on_cu: int) -> int:
        return -(-blocks_on_cu * waves_per_block // simds_per_cu)

    kblocks = -(-(-(-k // 128)) // split_k)
    waves = (rounds - 1) * waves_on_simd(per_cu) + waves_on_simd(-(-last // cus))
    return waves * kblocks * cycles_per_kblock
