"""The static K-loop estimate (codegen/build/estimate.py) on hand-written assembly, and the
tuner's best-first order built on it. The real kernels' estimates: tests/test_isa.py."""
import pytest

from codegen.build.estimate import estimate, loop_bodies, predicted_cycles
from codegen.targets import get_target
from codegen.tune import best_first

ASM = """
kernel:
	s_load_dwordx2 s[0:1], s[4:5], 0x0
.LBB0_1:                                ; =>This Inner Loop Header: Depth=1
	global_load_dwordx4 v[0:3], v[4:5], off
	ds_read_b128 v[8:11], v12
	ds_read2_b64 v[16:19], v13 offset1:8
	v_mfma_f32_16x16x32_fp8_fp8 a[0:3], v[8:9], v[16:17], a[0:3]
	v_mfma_f32_16x16x32_fp8_fp8 a[0:3], v[10:11], v[18:19], a[0:3]
	s_waitcnt lgkmcnt(0)
	v_add_u32_e32 v12, 0x100, v12
	s_cbranch_execz .LBB0_3
; %bb.2:                                ;   in Loop: Header=BB0_1 Depth=1
	ds_write_b128 v14, v[0:3]
.LBB0_3:                                ;   in Loop: Header=BB0_1 Depth=1
	s_add_i32 s2, s2, -1
	s_cbranch_scc1 .LBB0_1
; %bb.4:
	v_pk_mul_f32 v[20:21], v[20:21], v[22:23]
	s_endpgm
	.amdgpu_metadata
"""


def test_the_loop_is_the_marked_blocks():
    loops = loop_bodies(ASM)
    assert list(loops) == ["BB0_1"]
    depth, ops = loops["BB0_1"]
    assert depth == 1 and ops.count("v_mfma_f32_16x16x32_fp8_fp8") == 2
    assert "ds_write_b128" in ops and "s_add_i32" in ops and "v_pk_mul_f32" not in ops


def test_cycles_per_k_block():
    est = estimate(ASM, {"v_mfma_f32_16x16x32_fp8_fp8": 16}, per_kblock=1, wave=64,
                   lds_rates=(32, 32))
    # two K blocks per iteration; matrix 2 x 16; issue: 1 VALU x 4 + global, 3 ds, s_add,
    # s_cbranch_execz, s_cbranch_scc1 (the waitcnt issues nothing); LDS (16 + 16 + 16) x 64 / 32
    assert est.matrix_cycles == 16
    assert est.issue_cycles == (4 + 1 + 3 + 3) / 2
    assert est.lds_cycles == 48 * 64 / 32 / 2
    assert est.bound == "lds" and est.matrix_fraction == 16 / 48
    assert estimate(ASM, {"v_wmma_f32_16x16x16_fp8_fp8": 8}, 1, 32, (64, 64)) is None
    # reads at twice the write rate (CDNA4): the 32 bytes read take half the cycles they did
    fast_reads = estimate(ASM, {"v_mfma_f32_16x16x32_fp8_fp8": 16}, 1, 64, (64, 32))
    assert fast_reads.lds_cycles == (32 * 64 / 64 + 16 * 64 / 32) / 2


def test_gfx12_waits_issue_nothing():
    # gfx12 names its waits s_wait_loadcnt, s_wait_dscnt, s_wait_alu, ...; like s_waitcnt they
    # add no issue cycles, and s_barrier_signal / s_barrier_wait none either
    gfx12 = ASM.replace("s_waitcnt lgkmcnt(0)", "s_wait_dscnt 0x0\n\ts_wait_alu 0xfffd\n\t"
                        "s_wait_loadcnt 0x0\n\ts_barrier_signal -1\n\ts_barrier_wait -1")
    cycles = {"v_mfma_f32_16x16x32_fp8_fp8": 16}
    assert "s_wait_alu" in loop_bodies(gfx12)["BB0_1"][1]
    assert estimate(gfx12, cycles, 1, 64, (32, 32)) == estimate(ASM, cycles, 1, 64, (32, 32))


def test_predicted_cycles_counts_rounds_and_waves():
    # 4 x 4 blocks of 1 wave, 2 CUs of 4 SIMDs holding 8 blocks each: 16 blocks in one round,
    # 2 waves per SIMD, each 2 K blocks of 10 cycles
    assert predicted_cycles(10, 64, 64, 256, 16, 16, 1, 1, 8, 4, 2) == 2 * 2 * 10
    # twice the blocks: two rounds
    assert predicted_cycles(10, 128, 64, 256, 16, 16, 1, 1, 8, 4, 2) == 2 * (2 * 2 * 10)
    # split K: more blocks, fewer K blocks each
    assert predicted_cycles(10, 64, 64, 256, 16, 16, 2, 1, 8, 4, 2) == 2 * (2 * 1 * 10)
    # blocks of 2 waves, one per CU (its LDS): 8 rounds of a wave per busy SIMD
    assert predicted_cycles(10, 64, 64, 256, 16, 16, 1, 2, 1, 4, 2) == 8 * (1 * 2 * 10)


def test_blocks_per_cu_counts_idle_simds():
    t = get_target("gfx942")
    # 2 waves of 300 registers (304 allocated: 1 wave per SIMD), 54 KB of LDS: 1 block per CU,
    # where registers alone would hold 2 (4 SIMDs of one wave each)
    assert t.blocks_per_cu(300, 55296, 128) == 1 and t.blocks_per_cu(300, 0, 128) == 2
    # 8 waves of 128 registers: 4 per SIMD, 2 blocks; 72 KB of LDS on gfx950 (160 KB): still 2
    assert get_target("gfx950").blocks_per_cu(128, 73728, 512) == 2


def test_best_first_puts_estimated_candidates_first_by_prediction():
    cands = [dict(block_m=m, block_n=64, split_k=1) for m in (32, 64, 128)]
    est = {0: (100.0, 4, 2), 2: (90.0, 4, 2)}      # no estimate for candidate 1
    assert best_first(cands, est, 128, 256, 1024, cus=8, simds=4) == [2, 0, 1]


def test_best_first_ranks_by_the_cell_and_the_device_it_is_given():
    """Each argument reaches the prediction in its place: a tall tile suits a tall cell, more
    blocks a CU or fewer waves a block rank higher, and more CUs change which tiles fill them."""
    tall, wide = dict(block_m=256, block_n=16, split_k=1), dict(block_m=16, block_n=256, split_k=1)
    same = {0: (10.0, 4, 2), 1: (10.0, 4, 2)}
    assert best_first([tall, wide], same, 4096, 16, 1024, cus=8, simds=4) == [0, 1]
    assert best_first([tall, wide], same, 16, 4096, 1024, cus=8, simds=4) == [1, 0]
    # the same tile: more blocks a CU ranks first, then fewer waves a block
    assert best_first([tall, tall], {0: (10.0, 1, 1), 1: (10.0, 1, 4)}, 4096, 256, 1024,
                      cus=8, simds=4) == [1, 0]
    assert best_first([tall, tall], {0: (10.0, 8, 2), 1: (10.0, 2, 2)}, 4096, 256, 1024,
                      cus=8, simds=4) == [1, 0]
    # 64 small tiles fill 64 CUs in one round; on 8 CUs of one SIMD the larger ones win
    small, large = dict(block_m=64, block_n=64, split_k=1), dict(block_m=128, block_n=128,
                                                                 split_k=1)
    est = {0: (10.0, 1, 1), 1: (30.0, 1, 1)}
    assert best_first([small, large], est, 512, 512, 1024, cus=64, simds=4) == [0, 1]
    assert best_first([small, large], est, 512, 512, 1024, cus=8, simds=1) == [1, 0]


def test_tuner_estimates_name_a_bad_arch(capsys):
    from codegen import tune

    for arch, why in (("gfx9999", "unknown arch"), ("sm_90a", "not an AMD arch"),
                      ("gfx1100", "not an AMD arch with FP8")):
        with pytest.raises(SystemExit) as e:
            tune.main(["--estimates", arch])
        assert e.value.code == 2 and why in capsys.readouterr().err, arch


NESTED = """
kernel:
.LBB0_1:                                ; =>This Loop Header: Depth=1
	v_mfma_f32_16x16x32_fp8_fp8 a[0:3], v[8:9], v[16:17], a[0:3]
	v_mfma_f32_16x16x32_fp8_fp8 a[0:3], v[10:11], v[18:19], a[0:3]
	v_add_f32_e32 v1, v2, v3
	s_setprio 1
	ds_add_u32 v4, v5
	s_cbranch_scc1 .LBB0_1
.LBB0_2:                                ; =>This Inner Loop Header: Depth=2
	v_mfma_f32_16x16x32_fp8_fp8 a[4:7], v[8:9], v[16:17], a[4:7]
	s_cbranch_scc1 .LBB0_2
	s_endpgm
"""


@pytest.mark.parametrize("wave, issue, lds", [(64, 4 + 2, 64 * 4 / 32), (32, 1 + 2, 32 * 4 / 32)])
def test_the_loop_with_most_matrix_instructions_and_what_issues(wave, issue, lds):
    """The loop holding the most matrix instructions is the K loop, whatever its depth; a VALU
    instruction issues in 4 cycles on wave64, 1 on wave32; s_setprio issues nothing; an LDS
    op of no known width moves 4 bytes."""
    est = estimate(NESTED, {"v_mfma_f32_16x16x32_fp8_fp8": 16}, per_kblock=2, wave=wave,
                   lds_rates=(32, 32))
    assert (est.matrix_cycles, est.issue_cycles, est.lds_cycles) == (32, issue, lds)


def test_predicted_cycles_rounds_of_the_whole_device_and_a_partial_last():
    # 20 blocks, 2 CUs holding 2 each: 5 rounds of one wave a SIMD, 2 K blocks of 10 cycles
    assert predicted_cycles(10, 320, 16, 256, 16, 16, 1, 1, 2, 4, 2) == 5 * 2 * 10
    # 17 blocks, 16 a round (2 waves a SIMD), then 1 block: a wave on one SIMD
    assert predicted_cycles(10, 272, 16, 256, 16, 16, 1, 1, 8, 4, 2) == (2 + 1) * 2 * 10


@pytest.mark.parametrize("name, flops", [
    ("mfma_f32_16x16x32_fp8", 1024), ("mfma_f32_32x32x16_fp8", 1024),   # CDNA3
    ("mfma_f32_16x16x128_f8f6f4", 2048), ("mfma_f32_32x32x64_f8f6f4", 2048),   # CDNA4: 2x
    ("wmma_f32_16x16x16_fp8", 1024)])   # RDNA4, a SIMD32
def test_matrix_cycles_give_each_simd_its_peak_fp8_rate(name, flops):
    """Dense FP8 FLOPs a SIMD retires per cycle by the modelled issue-to-issue cycles, as the
    parts' peaks give them: MI300X 2614.9 TFLOP/s / (304 CUs x 4 SIMDs x 2.1 GHz) = 1024,
    MI355X about 5 PFLOP/s / (256 x 4 x 2.4 GHz) = 2035 (2048: 2x), R9700 383 TFLOP/s /
    (128 SIMD32 x 2.92 GHz) = 1024."""
    from codegen.matrix import ATOMS
    a = ATOMS[name]
    assert 2 * a.rows * a.cols * a.k / a.cycles == flops
