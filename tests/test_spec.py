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
    assert "group_quant_fp8" in families()
    for fam in families():
        for arch in TARGETS:
            enumerate_variants(fam, get_target(arch))


def test_occupancy_figures():
    # 64 VGPRs on CDNA3: 512 / 64 = 8 waves; 128 -> 4.
    assert get_target("gfx942").occupancy(64, 0, 256) == 8
    assert get_target("gfx942").occupancy(128, 0, 256) == 4
    # 32 registers on Hopper: 64 warps per SM.
    assert get_target("sm_90a").occupancy(32, 0, 256) == 64
