"""L1 + L2 for sm_90a: the Hopper and decode GEMM kernels compile to the instructions their
design rests on, with no spills (needs nvcc, and cuobjdump from CUDA or Triton's package; skipped
without them)."""
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

from codegen.families import gemm as fam
from codegen.render import render
from codegen.spec import make_variant
from codegen.targets import get_target
from codegen.toolchain import COMMON, Toolchain, cuobjdump


NVCC = shutil.which("nvcc")
CUOBJDUMP = cuobjdump(Toolchain("nvcc", NVCC, "", (), True)) if NVCC else None
pytestmark = pytest.mark.skipif(not (NVCC and CUOBJDUMP), reason="needs nvcc and cuobjdump")

def _configs() -> list[dict]:
    """Every Hopper-kernel tile the tuner may pick, at its deepest pipeline: the stage count sizes
    the shared-memory ring, not what a thread holds, so the deepest stands for the rest
    (test_gpu_gemm.py runs every tma config on the GPU)."""
    from codegen.tune import candidates

    deepest: dict = {}
    for c in candidates("sm_90a"):
        if c["kernel"] in ("tma", "wgmma"):
            key = tuple(v for k, v in c.items() if k != "stages")
            if key not in deepest or c["stages"] > deepest[key]["stages"]:
                deepest[key] = c
    return list(deepest.values())


CONFIGS = _configs()


def sass(v, tmp_path) -> tuple[str, str]:
    """(SASS, ptxas report) of one sm_90a variant."""
    tmp_path = Path(tmp_path)
    src = tmp_path / "k.cu"
    src.write_text(render(v))
    cubin = tmp_path / "k.cubin"
    ptxas = subprocess.run([NVCC, "-gencode=arch=compute_90a,code=sm_90a", *COMMON, "-cubin",
                            "-Xptxas=-v", "-o", str(cubin), str(src)],
                           capture_output=True, text=True, check=True).stderr
    return subprocess.run([CUOBJDUMP, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout, ptxas


# CCTL.IVALL (the L1 invalidate of a cluster barrier's acquire) touches no address
# An L2 prefetch (UBLKPF) is not among them: it changes nothing a load sees, so kernels may
# start their input's way into L2 before the wait.
_GLOBAL_ACCESS = re.compile(
    r"\b(LDG|STG|LD|ST|LDGSTS|UTMALDG|UTMASTG|CCTL(?!\.IVALL)|RED|ATOMG|ATOM)\b")


def assert_waits_before_memory(code: str) -> None:
    """Every kernel waits for the grid before it (griddepcontrol.wait: ACQBULK) before its first
    global load or store, and lets the next grid launch (launch_dependents: PREEXIT)."""
    kernels = re.split(r"\n\s*Function : ", code)[1:]
    assert kernels, "no kernel in the SASS"
    for k in kernels:
        name = k.split()[0]
        first = _GLOBAL_ACCESS.search(k)
        assert "ACQBULK" in k and "PREEXIT" in k, f"{name}: no programmatic dependent launch"
        assert first is None or k.index("ACQBULK") < first.start(), \
            f"{name}: {first.group(0)} before griddepcontrol.wait"


def _first_variants() -> list:
    """One variant of each family for sm_90a."""
    from codegen.spec import enumerate_variants, families, validate

    target = get_target("sm_90a")
    return [next(v for v in enumerate_variants(f, target) if validate(v) is None)
            for f in families()]


@pytest.mark.parametrize("variant", _first_variants(), ids=lambda v: v.family)
def test_every_family_waits_for_the_grid_before(variant, tmp_path):
    code = sass(variant, tmp_path)[0]
    assert_waits_before_memory(code)
    if variant.family != fam.FAMILY:
        # the memory-bound kernels start their own input into L2 while the grid before drains
        for k in re.split(r"\n\s*Function : ", code)[1:]:
            assert "UBLKPF" in k and k.index("UBLKPF") < k.index("ACQBULK"), \
                f"{k.split()[0]}: no L2 prefetch before griddepcontrol.wait"


def _gemm_variant(cfg: dict):
    return make_variant(fam.FAMILY, "sm_90a", fp8=get_target("sm_90a").fp8_formats[0].token, **cfg)


def _compile_in(cfg: dict) -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as d:
        return sass(_gemm_variant(cfg), d)


@cache
def _compiled() -> list[tuple[str, str]]:
    """(SASS, ptxas report) of every config, compiled a process per core."""
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(_compile_in, CONFIGS))


@pytest.mark.parametrize("i", range(len(CONFIGS)), ids=lambda i: (
    "{kernel}{block_m}x{block_n}s{stages}c{cluster}".format(**CONFIGS[i])))
def test_hopper_gemm_sass(i):
    cfg = CONFIGS[i]
    code, ptxas = _compiled()[i]
    # every kernel of the module (the tma kernel's split build too)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas)
    frames = re.findall(r"(\d+) bytes stack frame", ptxas)
    assert spills and all(x == ("0", "0") for x in spills), ptxas
    assert frames and all(x == "0" for x in frames), ptxas
    # every asynchronous MMA stays asynchronous (ptxas waits on each where it cannot prove which
    # registers one owns)
    assert "instructions are serialized" not in ptxas, ptxas
    kernels = re.split(r"\n\s*Function : ", code)[1:]
    split = cfg["kernel"] == "tma" and 256 not in (cfg["block_m"], cfg["block_n"])
    staged = fam.tma_staged_bytes(_gemm_variant(cfg)) > 0
    assert len(kernels) == 1 + split + staged, \
        f"{len(kernels)} kernels: the tma kernel has a split build except at 256 rows or " \
        f"columns, and narrow tiles a build taking A's scales with the stages"
    # only the staged build copies A's scales with the stages (a third tensor map)
    assert sum(k.count("UTMACCTL.PF") == 3 for k in kernels) == staged
    assert_waits_before_memory(code)
    n = fam.tma_wgmma_n(_gemm_variant(cfg)) if cfg["kernel"] == "tma" else cfg["block_n"]
    mma = re.findall(rf"QGMMA\.64x{n}x32\.F32\.E4M3\.E4M3", code)
    assert len(mma) >= 4, "no m64nNk32 e4m3 warpgroup MMA"
    if cfg["kernel"] == "tma":
        assert "UTMALDG.2D" in code, "loads do not use the tensor memory accelerator"
        assert "UTMASTG.2D" in code, "the epilogue does not store through the TMA"
        assert "USETMAXREG.DEALLOC" in code and "USETMAXREG.TRY_ALLOC" in code
        # a cluster shares B through multicast copies and syncs before its CTAs start and leave
        multicast = "UTMALDG.2D.MULTICAST" in code
        assert multicast == (cfg["cluster"] > 1), "multicast copies in the wrong configs"
        assert (code.count("UCGABAR_WAIT") >= 2) == (cfg["cluster"] > 1)
        # the consumers' registers go past the 168 a 384-thread block starts with
        if cfg["block_m"] == 128 and cfg["block_n"] == 128:
            assert max(int(r) for r in re.findall(r"\bR(\d+)\b", code)) >= 168
    else:
        assert "LDGSTS" in code and "UTMALDG" not in code


def _decode_configs() -> list[dict]:
    """The table's mma and gemv configs, a 4-block cluster, and 8 x 16 tiles with one K block
    in registers (bounded to 64 registers)."""
    table = list(fam.table("sm_90a").values())
    cfgs = [c for c in table if c["kernel"] in ("mma", "gemv")]
    cfgs += [fam.config("mma", 8, 16, split_k=4, cluster=4),
             fam.config("mma", 8, 16, split_k=16), fam.config("mma", 8, 16, split_k=8, cluster=8)]
    return list({tuple(c.items()): c for c in cfgs}.values())


@pytest.mark.parametrize("cfg", _decode_configs(), ids=lambda c: (
    "{kernel}{block_m}x{block_n}sk{split_k}s{stages}c{cluster}".format(**c)))
def test_decode_gemm_sass(cfg):
    """Clustered mma tiles sum through distributed shared memory between cluster barriers;
    register-bounded ones fit their bound (64 registers at 512 threads); the gemv kernel starts
    its weights into L2 before it waits for the grid before; no spills."""
    code, ptxas = _compile_in(cfg)
    assert re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas) == [("0", "0")]
    assert_waits_before_memory(code)
    cap = cfg["kernel"] == "mma" and fam.mma_register_cap(_gemm_variant(cfg), fam.atom_for(
        "sm_90a", "mma", ""))
    if cap:
        assert int(re.search(r"Used (\d+) registers", ptxas).group(1)) <= cap
    if cfg["kernel"] == "mma" and cfg["cluster"] > 1:
        assert code.count("UCGABAR_WAIT") >= 2, "no cluster barrier before and after the sum"
        assert "LD.E" in code, "no load of the other blocks' shared memory"
    if cfg["kernel"] == "gemv":
        assert "UBLKPF" in code and code.index("UBLKPF") < code.index("ACQBULK"), \
            "no L2 prefetch of the weights before griddepcontrol.wait"


# Local memory in the memory-bound kernels (the largest stack frame of a module, bytes): the
# fp32 + residual + scalar 1024-thread two-pass tier keeps its row index there across the fp32
# division's slow-path call (1024 threads leave 64 registers each); the fp16 UE8M0 quant's
# 32-thread tier keeps 8 bytes. One store and one load a thread; every other kernel has none.
KNOWN_STACK = {"rmsnorm_fp32_residual_scalar": 8,
               "rmsnorm_group_quant_fp16_g64_e4m3fn448_ue8m0": 8,
               "rmsnorm_group_quant_fp16_g128_e4m3fn448_ue8m0": 8}
MEMORY_BOUND = ("group_quant_fp8", "rmsnorm", "rmsnorm_group_quant", "dual_rmsnorm_group_quant")


def _ptxas_report(v) -> str:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.cu"
        src.write_text(render(v))
        return subprocess.run([NVCC, "-gencode=arch=compute_90a,code=sm_90a", *COMMON, "-cubin",
                               "-Xptxas=-v", "-o", str(Path(d) / "k.cubin"), str(src)],
                              capture_output=True, text=True, check=True).stderr


@pytest.mark.parametrize("family", MEMORY_BOUND)
def test_memory_bound_kernels_keep_to_registers(family):
    """Every sm_90a variant of the family compiles without spills or a stack frame, but for the
    few in KNOWN_STACK, which keep exactly what they are known to."""
    from codegen.spec import enumerate_variants, validate

    variants = [v for v in enumerate_variants(family, get_target("sm_90a"))
                if validate(v) is None]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        reports = list(pool.map(_ptxas_report, variants))
    found = {}
    for v, report in zip(variants, reports):
        frames = [int(b) for b in re.findall(r"(\d+) bytes stack frame", report)]
        assert frames, report
        if max(frames):
            found[v.uri] = max(frames)
    uris = {v.uri for v in variants}
    assert found == {u: b for u, b in KNOWN_STACK.items() if u in uris}
