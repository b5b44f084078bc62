"""Resource figures from the compiler: AMDGPU assembly metadata, or ptxas -v output."""
from __future__ import annotations

import re
from pathlib import Path

_AMD = {
    "vgpr_count": r"^\s+\.vgpr_count:\s+(\d+)",
    "sgpr_count": r"^\s+\.sgpr_count:\s+(\d+)",
    "vgpr_spill_count": r"^\s+\.vgpr_spill_count:\s+(\d+)",
    "sgpr_spill_count": r"^\s+\.sgpr_spill_count:\s+(\d+)",
    "scratch_bytes": r"^\s+\.private_segment_fixed_size:\s+(\d+)",
    "lds_bytes": r"^\s+\.group_segment_fixed_size:\s+(\d+)",
    "wavefront_size": r"^\s+\.wavefront_size:\s+(\d+)",
}


def _max(pattern: str, text: str) -> int:
    found = [int(x) for x in re.findall(pattern, text, re.M)]
    return max(found) if found else 0


def from_amdgpu_asm(asm: Path) -> dict:
    """Worst case over the kernels of one .s file."""
    text = asm.read_text()
    r = {k: _max(p, text) for k, p in _AMD.items()}
    r["spill_count"] = r.pop("vgpr_spill_count") + r.pop("sgpr_spill_count")
    return r


def from_ptxas_log(log: Path) -> dict:
    text = log.read_text()
    return {
        "vgpr_count": _max(r"Used (\d+) registers", text),
        "sgpr_count": None,
        "spill_count": _max(r"(\d+) bytes spill stores", text) + _max(r"(\d+) bytes spill loads", text),
        "scratch_bytes": _max(r"(\d+) bytes stack frame", text),
        "lds_bytes": _max(r"(\d+) bytes smem", text),
        "wavefront_size": 32,
    }


def amd_instructions(asm: Path, *mnemonics: str) -> dict[str, int]:
    """How often each instruction mnemonic occurs in the assembly."""
    text = asm.read_text()
    return {m: len(re.findall(rf"^\s+{re.escape(m)}\b", text, re.M)) for m in mnemonics}
