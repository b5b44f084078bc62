"""L0: specs, variants, URIs, validation."""
import subprocess
import sys

import pytest

from codegen.spec import enumerate_variants, families, make_variant, validate
from codegen.targets import TARGETS, get_target

FP8_ARCHS = ["gfx942", "gfx950", "gfx1200", "gfx1201", "sm_90a"]


def test_import_is_cheap_and_builds_nothing():
    code = ("import sys, time; t = time.perf_counter(); import codegen; "
            "dt = time.perf_counter() - t; assert 'torch' not in sys.modules; print(dt)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) < 0.5


@pytest.mark.parametrize("arch", FP8_ARCHS)
def test_quant_variants_enumerate_and_validate(arch):
    vs = enumerate_variants("group_quant_fp8", get_target(arch))
    n_fp8 = len(get_target(arch).fp8_formats)
    assert len(vs) == 3 * 3 * n_fp8 * 3 * 2
    assert len({v.uri for v in vs}) == len(vs)
    assert all(validate(v) is None for v in vs)


def test_uri_names_every_axis():
    v = make_variant("group_quant_fp8", "gfx942", dtype="fp16", group_size=64,
                     fp8="e4m3fnuz240", scale_layout="col_tma", ue8m0=True)
    assert v.uri == "group_quant_fp8_fp16_g64_e4m3fnuz240_col_tma_ue8m0"
    v2 = make_variant("group_quant_fp8", "gfx942", dtype="fp16", group_size=64,
                      fp8="e4m3fnuz240", scale_layout="col_tma", ue8m0=False)
    assert v2.uri == "group_quant_fp8_fp16_g64_e4m3fnuz240_col_tma"


def test_gfx942_defaults_to_fnuz_224_and_offers_240():
    t = get_target("gfx942")
    assert t.fp8_format().name == "e4m3fnuz" and t.fp8_format().max == 224
    assert t.fp8_format(240.0).max == 240
    with pytest.raises(ValueError, match="fp8_max"):
        t.fp8_format(448.0)


@pytest.mark.parametrize("arch", ["gfx1100", "gfx90a"])
def test_fp8_refused_where_no_hardware(arch):
    v = make_variant("group_quant_fp8", arch, dtype="bf16", group_size=128, fp8="none",
                     scale_layout="row", ue8m0=False)
    reason = validate(v)
    assert reason and "no FP8" in reason


def test_unknown_arch_and_axes_are_named():
    with pytest.raises(ValueError, match="supported: .*gfx1201"):
        get_target("gfx1030")
    with pytest.raises(ValueError, match="missing axes"):
        make_variant("group_quant_fp8", "gfx942", dtype="bf16")
    with pytest.raises(ValueError, match="unknown kernel family"):
        make_variant("nope", "gfx942")


def test_every_spec_loads():
    """Every family's axes have choices on every target; families small enough to list (the
    GEMM's tile axes span millions of combinations) enumerate to distinct URIs."""
    from math import prod

    from codegen.spec import load_family

    assert "group_quant_fp8" in families()
    for fam in families():
        for arch in TARGETS:
            target = get_target(arch)
            sizes = [len(axis.choices(target)) for axis in load_family(fam).axes]
            assert all(sizes), (fam, arch)
            if prod(sizes) <= 10_000:
                vs = enumerate_variants(fam, target)
                assert len({v.uri for v in vs}) == len(vs) == prod(sizes)


def test_occupancy_figures():
    # 64 VGPRs on CDNA3: 512 / 64 = 8 waves; 128 -> 4.
    assert get_target("gfx942").occupancy(64, 0, 256) == 8
    assert get_target("gfx942").occupancy(128, 0, 256) == 4
    # 32 registers on Hopper: 64 warps per SM.
    assert get_target("sm_90a").occupancy(32, 0, 256) == 64
    # LDS: 32 KB blocks of 8 waves; a CDNA3 CU (64 KB) holds 2 of them, 4 waves per SIMD; an
    # RDNA4 WGP (HIP's multiprocessor, 128 KB) holds 4, 8 waves per SIMD.
    assert get_target("gfx942").occupancy(64, 32768, 512) == 4
    assert get_target("gfx1201").occupancy(64, 32768, 256) == 8
    # the caps: 8 waves per CDNA3 SIMD however few the registers; Hopper's 227 KB of shared
    # memory holds one 200 KB block
    assert get_target("gfx942").occupancy(8, 0, 256) == 8
    assert get_target("sm_90a").occupancy(32, 200 * 1024, 128) == 4


def test_lds_rates_per_simd():
    # a dword per bank and cycle: 32 banks per CDNA3 CU, 64 per RDNA WGP, each shared by 4 SIMDs;
    # CDNA4 reads at twice CDNA3's rate
    for arch, read, write in (("gfx942", 32, 32), ("gfx950", 64, 32), ("gfx1201", 64, 64),
                              ("gfx1100", 64, 64)):
        t = get_target(arch)
        assert (t.lds_read_per_clk / t.simds_per_cu, t.lds_write_per_clk / t.simds_per_cu) == \
            (read, write), arch


# Variants each arch builds for the RMSNorm families (the ISA test compiles all of them for six
# AMD archs on CI, so the count is a budget): rmsnorm 3 dtypes x residual x vec16/scalar;
# rmsnorm_group_quant 2 dtypes x 3 group sizes x ue8m0 x residual per FP8 format; dual 2 x 3 x 2
# per FP8 format. The scale layout and the row length are run-time parameters.
NORM_FAMILIES = ["rmsnorm", "rmsnorm_group_quant", "dual_rmsnorm_group_quant"]
NORM_COUNTS = {"gfx942": (12, 48, 24), "gfx950": (12, 24, 12), "gfx1200": (12, 24, 12),
               "gfx1201": (12, 24, 12), "sm_90a": (12, 24, 12), "gfx1100": (12, 0, 0),
               "gfx90a": (12, 0, 0)}


@pytest.mark.parametrize("arch", list(NORM_COUNTS))
def test_rmsnorm_variant_counts(arch):
    target = get_target(arch)
    built = []
    for fam in NORM_FAMILIES:
        vs = enumerate_variants(fam, target)
        assert len({v.uri for v in vs}) == len(vs)
        built.append(sum(validate(v) is None for v in vs))
    assert tuple(built) == NORM_COUNTS[arch]
    assert sum(built) <= 84


@pytest.mark.parametrize("arch", ["gfx1100", "gfx90a"])
def test_rmsnorm_quant_refused_where_no_fp8(arch):
    for fam in NORM_FAMILIES[1:]:
        for v in enumerate_variants(fam, get_target(arch)):
            reason = validate(v)
            assert reason and "no FP8" in reason


def test_rmsnorm_uris():
    v = make_variant("rmsnorm", "gfx942", dtype="bf16", residual=True, load="vec16")
    assert v.uri == "rmsnorm_bf16_residual_vec16"
    v = make_variant("rmsnorm_group_quant", "gfx942", dtype="fp16", group_size=64,
                     fp8="e4m3fnuz240", ue8m0=True, residual=True)
    assert v.uri == "rmsnorm_group_quant_fp16_g64_e4m3fnuz240_ue8m0_residual"
    v = make_variant("dual_rmsnorm_group_quant", "sm_90a", dtype="bf16", group_size=128,
                     fp8="e4m3fn448", ue8m0=False)
    assert v.uri == "dual_rmsnorm_group_quant_bf16_g128_e4m3fn448"


def test_rmsnorm_tiers_share_threads_per_row():
    """The sum order depends on the threads per row alone, so every dtype and family must pick
    the same TPR for the same H (fused == unfused bit for bit, fp32 == bf16 sums)."""
    from codegen.families.dual_rmsnorm_quant import dual_tiers, max_h
    from codegen.families.rmsnorm import tier_for, tiers

    for wave in (32, 64):
        for h in [64, 128, 256, 264, 769, 1024, 1536, 2048, 2056, 5125, 7168, 8192, 8200,
                  16384, 16392, 32768, 65536]:
            tprs = {tier_for(h, d, wave).tpr for d in ("bf16", "fp16", "fp32")}
            assert len(tprs) == 1, (wave, h, tprs)
        for d in ("bf16", "fp16", "fp32"):
            table = tiers(d, wave)
            assert table[-1].two_pass and not any(t.two_pass for t in table[:-1])
            assert all(t.block % t.tpr == 0 and t.tpr % 16 == 0 for t in table)
        # the dual kernel's tiers are the standalone ones, up to its longest row
        for d in ("bf16", "fp16"):
            dual = dual_tiers(d, wave)
            assert list(dual) == list(tiers(d, wave)[:len(dual)]) and max_h(d, wave) == 8192


def test_split_tiers_sum_as_the_rmsnorm_tiers():
    """rmsnorm_group_quant's tiers hold some rows in fewer threads that sum as the rmsnorm tier
    of the same H would (Tier.split): each chunk in the same virtual thread, in the same order."""
    from codegen.families.rmsnorm import chunk_map, tier_for, tiers
    from codegen.families.rmsnorm_quant import quant_tiers

    for wave in (32, 64):
        for d in ("bf16", "fp16"):
            table = quant_tiers(d, wave)
            assert any(t.split > 1 for t in table)
            assert [t.cap for t in table] == [t.cap for t in tiers(d, wave)]
            assert quant_tiers(d, wave, residual=True) == tiers(d, wave)
            pairs = {(tier_for(h, d, wave, table), tier_for(h, d, wave))
                     for h in range(8, 70000, 8)}
            for t, ref in pairs:
                if t.split == 1:
                    assert t == ref
                    continue
                assert t.tpr * t.split == ref.tpr and t.items == ref.items * t.split
                assert t.tpr % wave == 0 and not t.two_pass
                assert chunk_map(t) == chunk_map(ref), t


@pytest.mark.parametrize("arch", ["sm_90a", "gfx942", "gfx1201"])
def test_rmsnorm_row_pipeline_where_copies_are_asynchronous(arch):
    """Rows go through shared memory only where the copy is asynchronous (cp.async on sm_90a),
    and only in the tiers the H200 measured faster: the 1024-thread one of rmsnorm, none of
    fused_add_rmsnorm, the one-wave one of rmsnorm_group_quant. The AMD sources launch
    the register kernels alone."""
    from codegen.render import render
    from codegen.spec import make_variant

    for residual in (False, True):
        v = make_variant("rmsnorm", arch, dtype="bf16", residual=residual, load="vec16")
        src = render(v)
        calls = [line.split("launch<")[1].split(">(")[0] for line in src.splitlines()
                 if "return launch<" in line]
        flags = [args.split(", ")[4] for args in calls]   # <TPR, ITEMS, TWO_PASS, BLOCK, STAGED>
        tprs = [int(args.split(", ")[0]) for args in calls]
        if arch.startswith("gfx") or residual:
            assert "STAGES = VECTOR ? 0 : 0" in src and set(flags) == {"false"}
            continue
        assert "STAGES = VECTOR ? 3 : 0" in src
        # the last tier reads rows twice and is never staged
        assert flags[-1] == "false"
        assert [tpr for tpr, f in zip(tprs, flags) if f == "true"] == [1024]
    # rmsnorm_group_quant: rows of one wave on sm_90a (32 threads: H <= 1024), with or without a
    # residual
    for residual in (False, True):
        v = make_variant("rmsnorm_group_quant", arch, dtype="bf16", group_size=128,
                         fp8=get_target(arch).fp8_format(None).token, ue8m0=False,
                         residual=residual)
        calls = [line.split("launch<")[1].split(">(")[0] for line in render(v).splitlines()
                 if "return launch<" in line]
        staged = [int(a.split(", ")[0]) for a in calls if a.split(", ")[4] == "true"]
        assert staged == ([] if arch.startswith("gfx") else [32])


def test_the_dispatcher_serves_the_fp8_format_asked_for_and_refuses_what_cannot_exist():
    from codegen.dispatch import Unsupported, variant_for
    from codegen.families import get as get_family

    kw = dict(dtype="bf16", group_size=128, scale_layout="row", ue8m0=False)
    assert variant_for("group_quant_fp8", "gfx942", **kw)["fp8"] == "e4m3fnuz224"
    assert variant_for("group_quant_fp8", "gfx942", fp8_max=240.0, **kw)["fp8"] == "e4m3fnuz240"
    assert variant_for("group_quant_fp8", "gfx942", fp8="e4m3fnuz240", **kw)["fp8"] == \
        "e4m3fnuz240"
    with pytest.raises(Unsupported, match="group_size=7"):
        variant_for("group_quant_fp8", "gfx942", **{**kw, "group_size": 7})
    with pytest.raises(Unsupported, match="fp8='e4m3fn448'"):
        variant_for("group_quant_fp8", "gfx942", fp8="e4m3fn448", **kw)
    with pytest.raises(Unsupported, match="no FP8"):
        variant_for("group_quant_fp8", "gfx1100", **kw)
    # a Hopper-only GEMM kernel asked for on CDNA3
    hopper = next(v for v in get_family("gemm_a8w8_blockscale").variants(get_target("sm_90a"))
                  if v["kernel"] in ("wgmma", "tma"))
    with pytest.raises(Unsupported, match="gfx942"):
        variant_for("gemm_a8w8_blockscale", "gfx942",
                    **{**dict(hopper.params), "fp8": "e4m3fnuz224"})


def test_a_variant_with_a_choice_its_target_lacks_is_invalid():
    v = dict(dtype="bf16", group_size=128, scale_layout="row", ue8m0=False)
    assert "fp8=" in validate(make_variant("group_quant_fp8", "gfx942", fp8="e4m3fn448", **v))
    assert "group_size=" in validate(make_variant("group_quant_fp8", "gfx942",
                                                  **{**v, "group_size": 7, "fp8": "e4m3fnuz224"}))
    with pytest.raises(ValueError, match=r"unknown axes \['bogus'\]"):
        make_variant("group_quant_fp8", "gfx942", fp8="e4m3fnuz224", bogus=1, **v)


def test_the_device_arch_from_torch(monkeypatch):
    import types

    import torch
    from codegen import targets

    props = types.SimpleNamespace(major=9, minor=0, gcnArchName="gfx942:sramecc+:xnack-")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.version, "hip", None)
    assert targets.device_arch(0) == "sm_90a"
    props.major, props.minor = 8, 9
    assert targets.device_arch(0) == "sm_89"
    monkeypatch.setattr(torch.version, "hip", "7.0.0")
    assert targets.device_arch(0) == "gfx942"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="visible GPU"):
        targets.native_arch()


def test_a_row_takes_the_first_tier_whose_cap_holds_its_chunks():
    """tier_for (the launcher's rule): rows of up to cap chunks of 8 take the tier, one element
    more the next."""
    from codegen.families.rmsnorm import tier_for, tiers
    table = tiers("bf16", 64)
    for t, wider in zip(table[:-2], table[1:-1]):
        assert tier_for(t.cap * 8, "bf16", 64) == t
        assert tier_for(t.cap * 8 + 1, "bf16", 64) == wider
    assert tier_for(1 << 20, "bf16", 64) == table[-1]


def test_an_unknown_family_is_named():
    from codegen import families as fams
    with pytest.raises(ValueError, match="unknown kernel family 'nope'"):
        fams.get("nope")


def test_amd_occupancy_counts_registers_in_granules():
    """A wave's VGPRs are allocated in granules (8 on CDNA, 24 on RDNA4 wave32): 73 registers
    take 80, 6 waves of 512; 97 take 120, 12 of 1536."""
    assert get_target("gfx942").occupancy(73, 0, 64) == 6
    assert get_target("gfx942").occupancy(72, 0, 64) == 7
    assert get_target("gfx1201").occupancy(97, 0, 32) == 12
    assert get_target("gfx1201").occupancy(96, 0, 32) == 16
