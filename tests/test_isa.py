"""L1 + L2: every variant compiles to AMDGPU assembly with the instructions and resources we expect.

Each arch is built once per session (ninja compiles in parallel); the tests read its manifest.
"""
import re

import pytest

from codegen.build.aot import build
from codegen.build.resources import amd_instructions
from codegen.families import gemm as gemm_family
from codegen.spec import make_variant
from codegen.targets import get_target

pytestmark = pytest.mark.isa

FP8_ARCHS = ["gfx942", "gfx950", "gfx1200", "gfx1201"]
LOAD128 = {"gfx942": "global_load_dwordx4", "gfx950": "global_load_dwordx4",
           "gfx1200": "global_load_b128", "gfx1201": "global_load_b128",
           "gfx1100": "global_load_b128", "gfx90a": "global_load_dwordx4"}
_built: dict = {}


@pytest.fixture(scope="session")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("generated")

    def get(arch):
        if arch not in _built:
            _built[arch] = build(get_target(arch), out_dir=out)
        return out / arch, _built[arch]
    return get


def rows(manifest, op):
    return [r for r in manifest["variants"] if r["op"] == op]


@pytest.mark.parametrize("arch", FP8_ARCHS)
def test_quant_isa(generated, arch):
    out, manifest = generated(arch)
    quant = rows(manifest, "group_quant_fp8")
    assert quant and all(r["status"] == "ok" for r in quant), \
        [(r["uri"], r["reason"]) for r in quant if r["status"] != "ok"]
    wave = get_target(arch).wave_size
    for r in quant:
        assert r["spill_count"] == 0 and r["scratch_bytes"] == 0, r["uri"]
        assert r["wavefront_size"] == wave
        counts = amd_instructions(out / r["asm"], "v_cvt_pk_fp8_f32", LOAD128[arch])
        assert counts["v_cvt_pk_fp8_f32"] > 0, r["uri"]
        # every variant reads its input with 16-byte loads
        assert counts[LOAD128[arch]] > 0, r["uri"]
        assert r["occupancy"] >= 4, (r["uri"], r["vgpr_count"])
        # a group's amax moves between lanes as DPP operands, and past a DPP row of 16 lanes
        # (fp32 at G = 128) as the row sums do: no LDS round trip (ds_bpermute)
        assert dpp_instructions(out / r["asm"]) > 0, r["uri"]
        assert amd_instructions(out / r["asm"], "ds_bpermute_b32")["ds_bpermute_b32"] == 0, \
            r["uri"]


def dpp_instructions(asm) -> int:
    """Instructions with a DPP lane exchange (quad_perm, row shifts / rotations)."""
    return len(re.findall(r"^\s+v_\w+_dpp\b", asm.read_text(), re.M))


def assert_row_sums_in_registers(asm, arch, uri) -> None:
    """Sums over rows past a DPP row take no LDS round trip: v_permlanex16 on the wave32
    targets, v_permlane16_swap / v_permlane32_swap on gfx950, and on gfx942 / gfx90a (no register
    form of those exchanges) the last steps read each 16-lane row's value as a scalar
    (v_readlane)."""
    names = ("ds_bpermute_b32", "v_permlanex16_b32", "v_permlane16_swap_b32_e32",
             "v_permlane32_swap_b32_e32", "v_readlane_b32")
    counts = amd_instructions(asm, *names)
    assert counts["ds_bpermute_b32"] == 0, uri
    if arch == "gfx950":
        assert counts["v_permlane16_swap_b32_e32"] > 0, uri
        assert counts["v_permlane32_swap_b32_e32"] > 0, uri
    elif get_target(arch).wave_size == 32:
        assert counts["v_permlanex16_b32"] > 0, uri
    else:
        assert counts["v_readlane_b32"] > 0, uri


@pytest.mark.parametrize("arch", ["gfx1100", "gfx90a"])
def test_fp8_variants_refused_without_fp8(generated, arch):
    _, manifest = generated(arch)
    quant = rows(manifest, "group_quant_fp8")
    assert quant and all(r["status"] == "skipped" for r in quant)
    assert all("no FP8" in r["reason"] for r in quant)
    assert not any(r["asm"] for r in quant)


def test_manifest_fields(generated):
    out, manifest = generated("gfx1201")
    assert manifest["arch"] == "gfx1201" and manifest["toolchain"]
    need = {"uri", "op", "dtype", "group_size", "fp8_format", "fp8_max", "status", "reason",
            "source", "asm", "vgpr_count", "sgpr_count", "spill_count", "scratch_bytes",
            "lds_bytes", "wavefront_size", "occupancy"}
    for r in manifest["variants"]:
        assert need <= set(r)
        if r["status"] == "ok":
            assert (out / r["source"]).exists() and (out / r["asm"]).exists()
            assert re.search(r"\.amdgcn_target\s+\"amdgcn-amd-amdhsa--gfx1201",
                             (out / r["asm"]).read_text())
    assert (out / "dispatch.json").exists() and (out / "build.ninja").exists()


# ---- RMSNorm family ----

ALL_ARCHS = ["gfx942", "gfx950", "gfx1200", "gfx1201", "gfx1100", "gfx90a"]
STORE128 = {"gfx942": "global_store_dwordx4", "gfx950": "global_store_dwordx4",
            "gfx1200": "global_store_b128", "gfx1201": "global_store_b128",
            "gfx1100": "global_store_b128", "gfx90a": "global_store_dwordx4"}
NORM_QUANT = ["rmsnorm_group_quant", "dual_rmsnorm_group_quant"]


def _resources_ok(r, arch):
    assert r["status"] == "ok", (r["uri"], r["reason"])
    assert r["spill_count"] == 0 and r["scratch_bytes"] == 0, (r["uri"], r["spill_count"])
    assert r["wavefront_size"] == get_target(arch).wave_size, r["uri"]
    assert r["occupancy"] >= 4, (r["uri"], r["vgpr_count"], r["occupancy"])


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_rmsnorm_isa(generated, arch):
    out, manifest = generated(arch)
    norm = rows(manifest, "rmsnorm")
    assert len(norm) == 12, [r["uri"] for r in norm]
    for r in norm:
        _resources_ok(r, arch)
        counts = amd_instructions(out / r["asm"], LOAD128[arch], STORE128[arch])
        assert dpp_instructions(out / r["asm"]) > 0, r["uri"]    # row sums within 16 lanes
        assert_row_sums_in_registers(out / r["asm"], arch, r["uri"])      # and across rows
        if r["params"]["load"] == "vec16":
            # the main path reads and writes rows with 16-byte accesses
            assert counts[LOAD128[arch]] > 0 and counts[STORE128[arch]] > 0, r["uri"]
        else:
            # the scalar path assumes no alignment beyond the element's
            assert counts[LOAD128[arch]] == 0 and counts[STORE128[arch]] == 0, r["uri"]


@pytest.mark.parametrize("arch", FP8_ARCHS)
@pytest.mark.parametrize("op", NORM_QUANT)
def test_rmsnorm_quant_isa(generated, arch, op):
    out, manifest = generated(arch)
    fused = rows(manifest, op)
    assert fused
    for r in fused:
        _resources_ok(r, arch)
        counts = amd_instructions(out / r["asm"], "v_cvt_pk_fp8_f32", LOAD128[arch])
        assert counts["v_cvt_pk_fp8_f32"] > 0, r["uri"]
        assert counts[LOAD128[arch]] > 0, r["uri"]
        assert_row_sums_in_registers(out / r["asm"], arch, r["uri"])


@pytest.mark.parametrize("arch", ["gfx1100", "gfx90a"])
@pytest.mark.parametrize("op", NORM_QUANT)
def test_rmsnorm_quant_refused_without_fp8(generated, arch, op):
    _, manifest = generated(arch)
    fused = rows(manifest, op)
    assert fused and all(r["status"] == "skipped" for r in fused)
    assert all("no FP8" in r["reason"] for r in fused)
    assert not any(r["asm"] for r in fused)


# ---- FP8 block-scale GEMM ----

@pytest.mark.parametrize("arch", FP8_ARCHS)
def test_gemm_isa(generated, arch):
    from codegen.matrix import atom_for

    out, manifest = generated(arch)
    gemm = rows(manifest, "gemm_a8w8_blockscale")
    assert gemm, "no GEMM variant built"
    target = get_target(arch)
    assert {atom_for(arch, "lds", a).mnemonic for a in gemm_family.LARGE_ATOMS
            if atom_for(arch, "lds", a)} <= {
        atom_for(arch, r["params"]["kernel"], r["params"]["atom"]).mnemonic for r in gemm}, \
        "every larger instruction of the target is built"
    for r in gemm:
        assert r["status"] == "ok", (r["uri"], r["reason"])
        assert r["spill_count"] == 0 and r["scratch_bytes"] == 0, (r["uri"], r["spill_count"])
        assert r["wavefront_size"] == target.wave_size
        assert r["lds_bytes"] <= target.lds_bytes, (r["uri"], r["lds_bytes"])
        assert r["occupancy"] >= 1, (r["uri"], r["vgpr_count"])
        if r["params"]["kernel"] == "gemv":
            _gemv_isa(out / r["asm"], r, arch)
            continue
        atom = atom_for(arch, r["params"]["kernel"], r["params"]["atom"])
        mnemonic = atom.mnemonic
        counts = amd_instructions(out / r["asm"], mnemonic, LOAD128[arch])
        # a K block takes fr * fc instructions per 8 bytes of K and lane (the loop body may be
        # unrolled, never thinned)
        v = make_variant("gemm_a8w8_blockscale", arch, **r["params"])
        per_block = gemm_family.wave_instructions_per_kblock(v, atom)
        assert counts[mnemonic] >= per_block and counts[mnemonic] % per_block == 0, \
            (r["uri"], counts[mnemonic], per_block)
        assert counts[LOAD128[arch]] > 0, r["uri"]
        # the static K-loop estimate: found, and its matrix share is the instruction's count
        # per K block at the instruction's cycles
        est = r["estimate"]
        assert est is not None, r["uri"]
        assert est["matrix_cycles"] == per_block * atom.cycles, (r["uri"], est)
        assert est["bound"] in ("matrix", "issue", "lds") and 0 < est["matrix_fraction"] <= 1
        assert est[f"{est['bound']}_cycles"] == max(
            est[f"{b}_cycles"] for b in ("matrix", "issue", "lds")), (r["uri"], est)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_cdna_large_tile_keeps_two_waves_a_simd(generated, arch):
    """The 128 x 128 tile dispatch picks at large M on CDNA was chosen for two waves a SIMD
    (gfx950's 64 x 64 wave tiles by two blocks a CU, at 254 of 256 registers): a compile that
    takes more registers would halve that silently."""
    _, manifest = generated(arch)
    large = gemm_family.heuristic(arch, 8192)
    (r,) = [r for r in rows(manifest, "gemm_a8w8_blockscale")
            if all(r["params"][key] == value for key, value in large.items())]
    assert r["occupancy"] >= 2, (r["uri"], r["vgpr_count"], r["occupancy"])


def _gemv_isa(asm, r, arch):
    """The decode GEMM, 16-byte loads, per unrolled step 16 bytes of B and of each A row per
    lane: on gfx12 dotted as FP8 (v_dot4_f32_fp8_fp8, four bytes each, nothing decoded), on the
    others decoded by the hardware (v_cvt_pk_f32_fp8, two bytes each) into f32 FMAs."""
    rows_a, unroll = r["params"]["block_m"], gemm_family.GEMV_UNROLL
    ops = [line.split()[0] for line in _instructions(asm)]
    cvt = sum(op.startswith("v_cvt_pk_f32_fp8") for op in ops)
    dot4 = sum(op == "v_dot4_f32_fp8_fp8" for op in ops)
    fma = sum(op.startswith(("v_fmac_f32", "v_fma_f32")) for op in ops)
    loads = sum(op == LOAD128[arch] for op in ops)
    if arch in ("gfx1200", "gfx1201"):
        assert dot4 >= 4 * rows_a * unroll and cvt == 0, (r["uri"], dot4, cvt)
    else:
        assert dot4 == 0, r["uri"]
        assert cvt >= 8 * (1 + rows_a) * unroll, (r["uri"], cvt)
        assert fma >= 16 * rows_a * unroll, (r["uri"], fma)
    assert loads >= (1 + rows_a) * unroll, (r["uri"], loads)
    assert_row_sums_in_registers(asm, arch, r["uri"])      # the wave sums of each row of A


@pytest.mark.parametrize("arch", ["gfx1100", "gfx90a"])
def test_gemm_refused_without_fp8(generated, arch):
    _, manifest = generated(arch)
    gemm = rows(manifest, "gemm_a8w8_blockscale")
    assert gemm and all(r["status"] == "skipped" and "no FP8" in r["reason"] for r in gemm)


def _instructions(asm) -> list[str]:
    """The instruction lines of an assembly file (directives, labels, comments and the metadata
    block dropped)."""
    out = []
    for line in asm.read_text().splitlines():
        s = line.split(";")[0].strip()
        if s.startswith(".amdgpu_metadata"):
            break
        if s and not s.startswith(".") and not s.endswith(":"):
            out.append(s)
    return out


def test_gfx1200_code_is_gfx1201s(generated):
    """gfx1200 and gfx1201 get the same instructions for every variant: what runs (and is
    emulated) on gfx1201 is what runs on gfx1200."""
    out0, m0 = generated("gfx1200")
    out1, m1 = generated("gfx1201")
    asm1 = {r["uri"]: r["asm"] for r in m1["variants"] if r["status"] == "ok"}
    checked = 0
    for r in m0["variants"]:
        if r["status"] == "ok":
            assert _instructions(out0 / r["asm"]) == _instructions(out1 / asm1[r["uri"]]), r["uri"]
            checked += 1
    assert checked == len(asm1) > 0


def test_precompiled_header_changes_no_instruction(generated, cache_dir):
    """An AOT folder's device compiles load the HIP system headers precompiled; the assembly is
    that of a compile parsing them (a JIT build of the one variant), one per family, but for
    the name of the per-file __hip_cuid symbol."""
    from codegen.build.aot import plan
    from codegen.build.jit import compile_variant
    from codegen.build.ninja import PCH

    d, _ = generated("gfx950")
    assert (d / PCH).exists()
    firsts = {}
    for e in plan(get_target("gfx950"), None):
        if e.status == "ok":
            firsts.setdefault(e.variant.family, e.variant)
    body = lambda p: [ln for ln in p.read_text().splitlines() if "__hip_cuid" not in ln]
    for v in firsts.values():
        assert body(d / f"{v.uri}.s") == body(compile_variant(v) / f"{v.uri}.s"), v.uri


def test_tuner_prints_estimates_without_a_gpu(cache_dir, capsys):
    """`python -m codegen.tune --estimates ARCH`: every candidate's K-loop estimate from its
    assembly, the bound being the largest of the three cycle counts."""
    from codegen import tune

    assert tune.main(["--estimates", "gfx1201", "--kernels", "lds"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    lds = [c for c in tune.candidates("gfx1201") if c["kernel"] == "lds"]
    assert len(rows) == len(lds) > 0
    for row in rows:
        uri, vgprs, spill, *cycles, bound, share = row.split()
        assert "_lds_" in uri and int(vgprs) > 0 and int(spill) == 0
        cycles = dict(zip(("matrix", "issue", "lds"), map(float, cycles)))
        assert cycles[bound] == max(cycles.values())
        assert float(share.strip("()")) == round(cycles["matrix"] / cycles[bound], 2)


def test_tuner_leaves_out_candidates_that_spill(cache_dir, monkeypatch, capsys):
    """The tuner (and the emulator sweep) time only AMD candidates whose assembly has no spill
    and no scratch; sm_90a's are left as they are (test_sass checks them)."""
    from codegen import tune
    from codegen.build import resources

    cands = [c for c in tune.candidates("gfx1201") if c["kernel"] == "lds"][:3]
    real = resources.from_amdgpu_asm
    spilled = lambda path: {**real(path), "spill_count": 3} if "_m64_n64_" in path.name \
        else real(path)
    monkeypatch.setattr(resources, "from_amdgpu_asm", spilled)
    kept = tune.without_spills("gfx1201", cands)
    assert kept == [c for c in cands if (c["block_m"], c["block_n"]) != (64, 64)]
    assert len(kept) < len(cands) and "3 registers spilled; left out" in capsys.readouterr().err
    sm90 = tune.candidates("sm_90a")[:2]
    assert tune.without_spills("sm_90a", sm90) == sm90
