"""GEMM configs, validation and dispatch tables, on any machine."""
import json

import pytest

from codegen.families import gemm as fam
from codegen.spec import make_variant, validate
from codegen.targets import TARGETS, get_target

FP8_ARCHS = [a for a, t in TARGETS.items() if t.has_fp8]


def variant(arch, **cfg):
    t = get_target(arch)
    if "block_k" not in cfg:
        cfg = fam.config(**cfg)
    return make_variant(fam.FAMILY, arch, fp8=t.fp8_formats[0].token, **cfg)


def test_m_buckets():
    assert [fam.m_bucket(m) for m in (1, 2, 3, 7, 16, 17, 83, 8192, 100000)] == \
        [1, 2, 4, 8, 16, 32, 128, 8192, 8192]


@pytest.mark.parametrize("arch", FP8_ARCHS)
def test_every_pick_is_a_valid_built_variant(arch):
    """Whatever the shape, dispatch names a config that validates and that the build compiles."""
    built = {v for v in fam.variants(get_target(arch))}
    for m in (1, 5, 16, 40, 100, 1000, 5000, 70000):
        for n, k in ((2112, 7168), (576, 3888), (100, 16), (32768, 512)):
            v = variant(arch, **fam.pick(arch, m, n, k))
            assert validate(v) is None, (m, n, k, validate(v))
            assert v in built, v.uri


def test_table_entries_are_used_and_valid():
    path = fam.table_path("sm_90a")
    entries = json.loads(path.read_text())["entries"]
    assert entries
    for e in entries:
        cfg = {**fam.config("mma", 1, 1), **e["config"]}   # axes added later take their default
        assert fam.pick("sm_90a", e["m"], e["n"], e["k"]) == cfg
        assert validate(variant("sm_90a", **cfg)) is None
    # a shape the table lacks falls back to the heuristic
    assert fam.pick("sm_90a", 4096, 1000, 1000) == fam.heuristic("sm_90a", 4096)


@pytest.mark.parametrize("arch,cfg,why", [
    ("gfx942", dict(kernel="wgmma", block_m=128, block_n=128, stages=4), "sm_90a"),
    ("sm_90a", dict(kernel="wgmma", block_m=128, block_n=32, stages=4), "64 or 128"),
    ("sm_90a", dict(kernel="wgmma", block_m=64, block_n=64, stages=1), "stages"),
    ("gfx950", dict(kernel="tma", block_m=128, block_n=128, stages=4), "sm_90a"),
    ("gfx942", dict(kernel="gemv", block_m=8, block_n=2, split_k=4), "at most 4 rows of A"),
    ("gfx942", dict(kernel="gemv", block_m=1, block_n=8, split_k=4), "exceed 1024"),
    ("sm_90a", dict(kernel="gemv", block_m=4, block_n=4, split_k=4), "registers"),
    ("sm_90a", dict(kernel="tma", block_m=128, block_n=8, stages=4), "64, 128 or 256 in M"),
    ("sm_90a", dict(kernel="tma", block_m=256, block_n=192, stages=2), "at most 128 wide"),
    ("sm_90a", dict(kernel="tma", block_m=128, block_n=128, stages=1), "2 or more stages"),
    ("sm_90a", dict(kernel="tma", block_m=256, block_n=128, stages=4), "shared memory"),
    ("sm_90a", dict(kernel="tma", block_m=256, block_n=128, stages=3, cluster=2),
     "without clusters"),
    ("sm_90a", dict(kernel="tma", block_m=128, block_n=56, stages=4, cluster=2),
     "whole 8-row groups"),
    ("sm_90a", dict(kernel="wgmma", block_m=128, block_n=128, stages=4, cluster=2), "not of wgmma"),
    ("gfx942", dict(kernel="mma", block_m=16, block_n=16, split_k=4, cluster=2), "sm_90a option"),
    ("sm_90a", dict(kernel="tma", block_m=128, block_n=128, stages=4, cluster=4), "1 or 2"),
    ("gfx942", dict(kernel="lds", block_m=128, block_n=64, stages=2, cluster=2), "multicast"),
    ("gfx942", dict(kernel="mma", block_m=8, block_n=16), "16x16"),
    ("gfx1201", dict(kernel="mma", block_m=64, block_n=64), "registers"),
    ("gfx942", dict(kernel="mma", block_m=16, block_n=16, stages=4), "1 or 2 K blocks"),
    ("sm_90a", dict(kernel="mma", block_m=8, block_n=64, split_k=4, stages=2), "stages=2"),
    ("gfx942", dict(kernel="lds", block_m=16, block_n=64, stages=2), "multiples of 32"),
    ("gfx942", dict(kernel="lds", block_m=64, block_n=64, stages=1), "stages=2"),
    ("gfx1201", dict(kernel="lds", block_m=256, block_n=128, stages=2), "LDS exceed 65536"),
    ("sm_90a", dict(kernel="lds", block_m=128, block_n=128, stages=2), "LDS exceed 49152"),
    ("gfx1201", dict(kernel="lds", block_m=64, block_n=64, stages=2, atom="32x32x16"),
     "does not have"),
    ("gfx942", dict(kernel="lds", block_m=64, block_n=64, stages=2, atom="16x16x128"),
     "does not have"),
    ("gfx942", dict(kernel="lds", block_m=64, block_n=64, stages=2, atom="32x32x64"),
     "does not have"),
    ("gfx950", dict(kernel="mma", block_m=32, block_n=32, atom="32x32x16"), "does not have"),
    ("gfx942", dict(kernel="mma", block_m=16, block_n=16, l2_first_pass=True), "sm_90a option"),
    ("sm_90a", dict(kernel="tma", block_m=128, block_n=128, stages=4, l2_first_pass=True),
     "of the mma kernel"),
])
def test_validation_rejects_before_compiling(arch, cfg, why):
    assert why in (validate(variant(arch, **cfg)) or "")


@pytest.mark.parametrize("arch, cfg, bound", [
    ("sm_90a", dict(block_m=8, block_n=16, split_k=16), "(SPLIT_K * WAVE, 2)"),
    ("sm_90a", dict(block_m=8, block_n=16, split_k=4), "(SPLIT_K * WAVE, 8)"),
    ("sm_90a", dict(block_m=8, block_n=16, split_k=16, stages=2), "(SPLIT_K * WAVE)"),
    ("sm_90a", dict(block_m=8, block_n=32, split_k=16), "(SPLIT_K * WAVE)"),
    ("gfx942", dict(block_m=16, block_n=16, split_k=4), "(SPLIT_K * WAVE)"),
])
def test_mma_register_bound(arch, cfg, bound):
    """sm_90a mma tiles with one K block in registers whose fragments fit 64 registers ask for
    as many blocks as 64 registers a thread allow; the rest leave the count to the compiler
    (AMD always)."""
    from codegen.render import render
    v = variant(arch, kernel="mma", **cfg)
    assert validate(v) is None
    assert f"__launch_bounds__{bound} gemm_kernel(" in render(v)
    assert ("PREFETCH = true;" in render(v)) == (cfg.get("stages") == 2)


@pytest.mark.parametrize("arch", FP8_ARCHS)
def test_every_default_config_validates(arch):
    for c in fam.default_configs(arch):
        assert validate(variant(arch, **c)) is None, (arch, c)


@pytest.mark.parametrize("arch", FP8_ARCHS)
def test_every_heuristic_pick_validates(arch):
    for m in range(1, 300):
        for n in (None, 128, 7168):
            assert validate(variant(arch, **fam.heuristic(arch, m, n))) is None, (arch, m, n)


@pytest.mark.parametrize("arch", FP8_ARCHS)
def test_decode_pick_by_n_and_k(arch):
    """M = 1 without a table entry: more waves a row of B only as N gets too small to fill the
    device and K long enough to give their lanes pieces to keep in flight; short rows of many
    columns on sm_90a in the mma kernel; every pick in the build."""
    built, waves = fam.default_configs(arch), {}
    for n in (100, 300, 1000, 3001, 7000, 30000):
        for k in range(128, 20000, 16 * 23):
            c = fam.pick(arch, 1, n, k)
            assert c in built and validate(variant(arch, **c)) is None, (n, k, c)
            if arch == "sm_90a" and k <= 1536 and n >= 4096:
                assert c["kernel"] == "mma" and c["block_m"] == 8, (n, k, c)
            else:
                assert c["kernel"] == "gemv", (n, k, c)
                waves[n, k] = c["split_k"]
                assert c["block_n"] * c["split_k"] <= 16, (n, k, c)
    ns = sorted({n for n, _ in waves})
    for (n, k), w in waves.items():   # no fewer at a smaller N or a longer K
        wider = ns[ns.index(n) + 1] if n != ns[-1] else None
        assert w >= waves.get((wider, k), 1) and w >= waves.get((n, k - 16 * 23), 1), (n, k)
    assert {w for (n, _), w in waves.items() if n == 30000} == {1}
    assert max(waves.values()) >= 2 and fam.heuristic(arch, 1)["split_k"] == 4


@pytest.mark.parametrize("arch,cus,wide", [
    ("gfx942", 304, dict(atom="", wave_tile="w64x32")),
    ("gfx950", 256, dict(atom="16x16x128", wave_tile="w64x64"))])
def test_cdna_tile_by_how_many_128_tiles_fill_the_cus(arch, cus, wide):
    """CDNA past M = 16: 128 x 128 tiles (in the target's wave tiles) once they give every CU
    one, else 64 x 64 (more blocks); the device's count decides, the target's largest part's
    without one; RDNA keeps its tile."""
    assert get_target(arch).multiprocessors == cus
    large = fam.config("lds", 128, 128, stages=2, **wide)
    small = fam.config("lds", 64, 64, stages=2)
    at = {m: -(-cus // -(-m // 128)) * 128 for m in (128, 1024, 4096)}   # N where tiles = cus
    for m, n in at.items():
        assert fam.heuristic(arch, m, n) == large, (m, n)
        assert fam.heuristic(arch, m, n - 128) == small, (m, n)
        assert fam.pick(arch, m, n - 128, 7168, cus=(-(-m // 128)) * (n // 128 - 1)) == large
    assert fam.heuristic(arch, 17, 1 << 20) == large and fam.heuristic(arch, 16, 1 << 20) != large
    assert fam.heuristic(arch, 8192) == large      # no N: as if the tiles fill the device
    assert fam.heuristic("gfx1201", 8192, 576) == fam.config("lds", 128, 64, stages=2)


@pytest.mark.parametrize("arch", ["gfx1100", "gfx90a"])
def test_no_fp8_no_gemm(arch):
    (v,) = fam.variants(get_target(arch))
    assert "no FP8" in validate(v)


def test_tuner_writes_each_cell_over_the_table(tmp_path):
    """A tune run writes its winners over the table's other entries, in the table's order, as
    whole files (what a run cut short leaves behind)."""
    from codegen.tune import write_table

    cfg = fam.config("tma", 128, 128, stages=4)
    old = [dict(m=m, n=576, k=7168, config=fam.config("mma", 8, 16), us=9.0, tflops=1.0)
           for m in (1, 16, 64)]
    path = tmp_path / "table.json"
    write_table(path, "sm_90a", old, {})
    base = fam.table_entries(path)
    assert list(base) == [(1, 576, 7168), (16, 576, 7168), (64, 576, 7168)]
    won = [dict(m=16, n=576, k=7168, config=cfg, us=5.0, tflops=2.0),
           dict(m=4096, n=576, k=7168, config=cfg, us=50.0, tflops=700.0)]
    write_table(path, "sm_90a", won[:1], base)
    write_table(path, "sm_90a", won, base)
    got = fam.table_entries(path)
    assert list(got) == [(1, 576, 7168), (16, 576, 7168), (64, 576, 7168), (4096, 576, 7168)]
    assert got[(16, 576, 7168)]["config"] == cfg and got[(1, 576, 7168)] == old[0]
    assert [f.name for f in tmp_path.iterdir()] == ["table.json"]   # no temporary left
    write_table(path, "sm_90a", won, {})   # a full run: its cells only
    assert list(fam.table_entries(path)) == [(16, 576, 7168), (4096, 576, 7168)]


@pytest.fixture
def tuner_stand_in(monkeypatch):
    """codegen.tune's loop on the CPU: no compile, one input set, sm_90a's 132 SMs, and a GEMM
    that returns the reference (or garbage for configs in .wrong) in a time .times gives it."""
    import types

    import torch

    import codegen.ops.gemm as ops_gemm
    from codegen import reference, tune

    state = types.SimpleNamespace(wrong=[], times=lambda cfg: 10.0, last=None, sa_strides=set())
    randn, rand = torch.randn, torch.rand
    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **k: randn(*a, **k))
    monkeypatch.setattr(torch, "rand", lambda *a, device=None, **k: rand(*a, **k))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tune, "native_arch", lambda: "sm_90a")
    monkeypatch.setattr(tune, "compile_all", lambda arch, cands: None)
    monkeypatch.setattr(tune, "input_sets", lambda nbytes: 1)

    def gemm(a, sa, b, sb, cfg):
        state.last = cfg
        state.sa_strides.add(sa.stride())
        out = reference.gemm_a8w8_blockscale(a, sa, b, sb)
        return out * 2 + 1 if cfg in state.wrong else out

    def graph_us(make, nbytes):
        make()()                  # one call: the GEMM notes its config
        return state.times(state.last)
    monkeypatch.setattr(ops_gemm, "gemm_with_config", gemm)
    monkeypatch.setattr(tune, "graph_us", graph_us)
    monkeypatch.setattr(tune, "graphs_us", lambda makes, nbytes: [graph_us(m, 0) for m in makes])
    return state


def test_tuner_writes_only_right_configs_under_the_k_dispatch_looks_up(tmp_path, tuner_stand_in,
                                                                         capsys, monkeypatch):
    """A cell's winner is the fastest config that passed the check, the incumbent (dispatch's
    pick, timed beside a --kernels run) included; K not a multiple of 16 is tuned and written
    as the op runs and looks it up (padded); a cell where nothing is right keeps its entry and
    the run exits 1."""
    from codegen import tune

    out = tmp_path / "t.json"
    held = fam.pick("sm_90a", 16, 256, 256)
    assert held["kernel"] == "mma"                 # not among --kernels wgmma: the incumbent
    tuner_stand_in.wrong = [held]
    tuner_stand_in.times = lambda cfg: 1.0 if cfg == held else 10.0 + cfg["block_n"] / 64
    argv = ["--ms", "16", "--shapes", "256x256,256x200", "--kernels", "wgmma", "--out", str(out)]
    assert tune.main(argv) == 0
    got = fam.table_entries(out)
    assert {(16, 256, 256), (16, 256, 208)} <= set(got)
    for key in ((16, 256, 256), (16, 256, 208)):
        assert got[key]["config"]["kernel"] == "wgmma"
        assert got[key]["config"]["block_n"] == min(c["block_n"] for c in tune.candidates(
            "sm_90a") if c["kernel"] == "wgmma")
    assert "is wrong" in capsys.readouterr().err
    tuner_stand_in.wrong = [c for c in tune.candidates("sm_90a")] + [held]
    before = fam.table_entries(out)
    assert tune.main(argv) == 1
    assert fam.table_entries(out) == before
    assert "no candidate is right" in capsys.readouterr().err
    monkeypatch.setattr(tune, "MS", [16])             # a full run, of one cell
    monkeypatch.setattr(fam, "TUNED_SHAPES", [(256, 256)])
    assert tune.main(["--out", str(out)]) == 1 and fam.table_entries(out) == before


def test_tuner_times_the_scale_layout_asked_for(tuner_stand_in, tmp_path):
    """--scales col_tma: every call the tuner checks and times gets A's scales column-major in
    the quant op's padded layout, as the engine that asked for it will pass them."""
    from codegen import tune

    argv = ["--ms", "5", "--shapes", "256x256", "--kernels", "wgmma", "--out",
            str(tmp_path / "t.json")]
    assert tune.main(argv) == 0
    assert tuner_stand_in.sa_strides == {(2, 1)}            # M = 5, K = 256: [5, 2] row-major
    tuner_stand_in.sa_strides.clear()
    assert tune.main(argv + ["--scales", "col_tma"]) == 0
    assert tuner_stand_in.sa_strides == {(1, 8)}            # columns of 5 rows padded to 8


def test_tuner_refuses_what_it_cannot_tune(tuner_stand_in, monkeypatch, tmp_path):
    from codegen import tune

    small = {"--ms": "16", "--shapes": "256x256", "--out": str(tmp_path / "t.json")}
    for bad in ({"--ms": "0"}, {"--shapes": "576x7168x2"}, {"--top": "0"},
                {"--kernels": "wgmma,bogus"}, {"--estimates": "gfx942", "--kernels": "tma"}):
        with pytest.raises(SystemExit) as e:
            tune.main([x for kv in {**small, **bad}.items() for x in kv])
        assert e.value.code == 2, bad
    assert not (tmp_path / "t.json").exists()

    def no_gpu():
        raise RuntimeError("no GPU")
    monkeypatch.setattr(tune, "native_arch", no_gpu)
    assert tune.main([]) == 2


def test_only_a_full_tune_run_drops_the_tables_other_entries(tmp_path):
    """--quick times five M values: like --ms / --shapes / --kernels, it keeps the table's other
    entries. With --out, the entries kept are that file's where it exists (a run resumed)."""
    import argparse

    from codegen.tune import table_scope, write_table

    ap_defaults = dict(quick=False, ms=None, shapes=None, kernels=None, out=None)
    args = lambda **kw: argparse.Namespace(**{**ap_defaults, **kw})   # noqa: E731
    table = fam.table_path("sm_90a")
    assert table_scope(args(), "sm_90a") == (table, fam.table_entries(table), True)
    for kw in (dict(quick=True), dict(ms="16"), dict(shapes="576x7168"), dict(kernels="tma")):
        assert table_scope(args(**kw), "sm_90a")[2] is False, kw
    out = tmp_path / "mine.json"
    assert table_scope(args(out=str(out), ms="16"), "sm_90a")[1] == fam.table_entries(table)
    mine = [dict(m=16, n=576, k=7168, config=fam.config("tma", 128, 128, stages=4), us=1.0,
                 tflops=1.0)]
    write_table(out, "sm_90a", mine, {})
    assert table_scope(args(out=str(out), ms="64"), "sm_90a")[1] == fam.table_entries(out)


def test_tuner_candidates_validate():
    from codegen.tune import candidates

    for arch, kernels in [("sm_90a", {"mma", "gemv", "wgmma", "tma"}),
                          ("gfx942", {"mma", "lds", "gemv"}), ("gfx1201", {"mma", "lds", "gemv"})]:
        cands = candidates(arch)
        assert {c["kernel"] for c in cands} == kernels, arch
        for c in cands:
            assert validate(variant(arch, **c)) is None, (arch, c)


def test_tuner_skips_only_configs_that_cannot_win_and_the_table_holds_none_of_those():
    from codegen.tune import plausible

    c = fam.config
    assert plausible(c("gemv", 1, 8, split_k=2), 1) and plausible(c("gemv", 8, 8), 8)
    assert not plausible(c("gemv", 1, 8), 2)                  # a second pass over B
    assert plausible(c("mma", 16, 16, split_k=8), 128) and plausible(c("mma", 64, 16), 64)
    assert not plausible(c("mma", 16, 16), 129) and not plausible(c("mma", 32, 16), 16)
    assert plausible(c("tma", 64, 64, stages=4), 1) and not plausible(c("tma", 64, 128), 8)
    assert plausible(c("tma", 64, 128), 16) and not plausible(c("tma", 128, 128), 15)
    for arch in TARGETS:
        for (m, _, _), cfg in fam.table(arch).items():
            assert plausible(cfg, m), (arch, m, cfg)


def test_tuner_times_again_only_the_near_equal_configs():
    from codegen.tune import FINALISTS, NEAR, finalists

    sweep = [(10.0 * NEAR * 1.01, "slow", 0), (10.2, "b", 1), (10.0, "a", 2), (10.4, "c", 3)]
    assert [c for _, c, _ in finalists(sweep)] == ["a", "b", "c"]
    many = [(10.0 + i / 100, str(i), i) for i in range(FINALISTS + 3)]
    assert len(finalists(many)) == FINALISTS and finalists([]) == []


def test_restricted_tuner_run_times_what_dispatch_picks_now():
    """A --kernels run also times the cell's current pick, a table entry or, for an M bucket the
    table lacks, the heuristic: a mma-only run cannot replace a wgmma cell with a slower mma."""
    from codegen.tune import candidates, incumbent

    mma = [c for c in candidates("sm_90a") if c["kernel"] == "mma"]
    entry = fam.table("sm_90a")[(4096, 4096, 7168)]
    assert entry["kernel"] == "tma" and incumbent("sm_90a", 4096, 4096, 7168, mma) == entry
    assert incumbent("sm_90a", 4096, 4096, 7168, candidates("sm_90a")) is None
    assert incumbent("sm_90a", 32, 1000, 3000, mma) == fam.heuristic("sm_90a", 32)


def test_l2_first_pass_prefetches_before_the_wait_only_where_asked():
    """The option adds the weights' bulk L2 prefetch ahead of pdl_begin and nothing else: off,
    the kernel has no prefetch at all."""
    from codegen.render import render

    on = render(variant("sm_90a", kernel="mma", block_m=8, block_n=16, split_k=16,
                        l2_first_pass=True))
    off = render(variant("sm_90a", kernel="mma", block_m=8, block_n=16, split_k=16))
    body = on[on.index("gemm_kernel("):]
    assert body.index("cg::prefetch_l2(") < body.index("cg::pdl_begin();")
    assert "cg::prefetch_l2(" not in off[off.index("gemm_kernel("):]


@pytest.mark.parametrize("arch", ["sm_90a", "gfx942", "gfx950", "gfx1201"])
def test_tuner_candidates_are_distinct_variants(arch):
    """Each candidate names its own module (split_k 14 against 1 and 4, say)."""
    from codegen.tune import candidates

    uris = [variant(arch, **c).uri for c in candidates(arch)]
    assert len(set(uris)) == len(uris) and any("_sk14_" in u for u in uris)


def test_the_op_picks_by_m_not_by_the_first_m_of_its_bucket():
    """On CDNA off the table, M within one bucket decides whether 128 x 128 tiles fill the
    device: the op's pick for M = 4096 does not depend on an M = 2049 call before it."""
    import torch

    from codegen import ops
    from codegen.ops import _common

    class Device:      # an MI300X whose kernels do nothing; which configs were launched
        arch, multiprocessors = "gfx942", 304

        def __init__(self):
            self.picked = []

        def kernel(self, v):
            return lambda *args: self.picked.append((v["block_m"], v["block_n"])) or 0

    dev = Device()
    _common.attach_emulated(dev)
    try:
        b = torch.zeros(2112, 7168, dtype=torch.float8_e4m3fnuz)
        sb = torch.ones(17, 56)
        for m in (2049, 4096):     # one bucket: 289 tiles of 128 x 128, then 544, for 304 CUs
            a = torch.zeros(m, 7168, dtype=torch.float8_e4m3fnuz)
            ops.gemm_a8w8_blockscale(a, torch.ones(m, 56), b, sb)
    finally:
        _common.attach_emulated(None)
    assert fam.m_bucket(2049) == fam.m_bucket(4096)
    assert dev.picked == [(64, 64), (128, 128)]


def test_a_table_entry_serves_every_m_of_its_bucket():
    """M = 3 takes the M = 4 bucket's tuned entry (mma 8 x 16, split 14), not the heuristic's
    8 x 32 split 8."""
    tuned = fam.table("sm_90a")[(4, 2112, 7168)]
    assert (tuned["kernel"], tuned["block_n"], tuned["split_k"]) == ("mma", 16, 14)
    assert fam.pick("sm_90a", 3, 2112, 7168) == tuned
    assert fam.heuristic("sm_90a", 3, 2112, k=7168) != tuned


def test_sm90a_heuristic_at_its_m_edges():
    """Off the table on sm_90a: 8 x 32 tiles up to M = 8, 16 x 32 to 16, wgmma 64 x 64 to 128,
    the tma kernel's 128 x 128 past it; decode on rows of at most 1536 across >= 4096 columns
    in the mma kernel, split over as many K blocks as there are, up to 4."""
    h = lambda m, **kw: fam.heuristic("sm_90a", m, **kw)   # noqa: E731
    assert [(h(m)["kernel"], h(m)["block_m"]) for m in (8, 9, 16, 17, 128, 129)] == [
        ("mma", 8), ("mma", 16), ("mma", 16), ("wgmma", 64), ("wgmma", 64), ("tma", 128)]
    assert [h(1, n=4096, k=k)["split_k"] for k in (128, 256, 512, 1536)] == [1, 2, 4, 4]
    assert h(1, n=4096, k=1536)["kernel"] == "mma"
    assert h(1, n=4096, k=1552)["kernel"] == "gemv" and h(1, n=4095, k=128)["kernel"] == "gemv"


def test_decode_waves_a_row_fill_the_device():
    """gemv_split: 576 x 7168 on the H200's 132 SMs needs 4 warps a row to give each SM 512
    threads (132 * 512 / (576 * 32) rounds up to 4), K caps it at 3 pieces' worth -> 4; the
    R9700's 32 CUs are filled with one; wider N takes one everywhere. gemv blocks hold 16
    threads' worth of rows on sm_90a, 8 elsewhere."""
    assert [fam.gemv_split("sm_90a", n, 7168) for n in (576, 2112, 24576)] == [4, 1, 1]
    assert fam.gemv_split("gfx1201", 576, 7168) == 1
    assert fam.gemv_split("sm_90a", 576, 7168, cus=8) == 1
    assert [fam.gemv_config("sm_90a", s)["block_n"] for s in (1, 2, 4)] == [8, 8, 4]
    assert [fam.gemv_config("gfx942", s)["block_n"] for s in (1, 2, 4)] == [8, 4, 2]


def test_padded_k_is_the_next_multiple_of_16():
    assert [fam.padded_k(k) for k in (16, 32, 8, 100, 3884, 7168)] == [16, 32, 16, 112, 3888, 7168]


def test_tile_figures_the_templates_take():
    """What context() hands the templates, pinned where only a GPU would notice a change:
    shared memory of the stages, 1024 bytes of alignment, tma's bf16 output tile and two
    8-byte mbarriers a stage; the staged scales of narrow tiles; a producer warpgroup and up to
    two consumers; one partial-sum set at 256 rows or over 128 columns; 256-wide tiles as two
    128-wide consumers."""
    tma = lambda bm, bn, s: variant("sm_90a", kernel="tma", block_m=bm, block_n=bn,   # noqa: E731
                                    stages=s)
    assert fam.wgmma_smem_bytes(tma(128, 128, 5)) == 5 * 256 * 128 + 1024 + 128 * 128 * 2 + 80
    narrow = tma(128, 64, 4)
    assert fam.tma_staged_bytes(narrow) == 128 + 4 * 128 * 4
    assert fam.context(narrow)["staged_scales"] and not fam.context(tma(128, 128, 5))[
        "staged_scales"]
    assert [fam.block_threads(tma(bm, 128, 3)) for bm in (64, 128, 256)] == [256, 384, 384]
    assert [fam.tma_one_set(tma(bm, bn, 3)) for bm, bn in ((256, 128), (128, 192), (128, 128))] \
        == [True, True, False]
    assert [fam.tma_wgmma_n(tma(128, bn, 3)) for bn in (192, 256)] == [192, 128]
    assert fam.context(tma(128, 256, 3))["wgmma_n"] == 128
    # the last tile that fits the 232448 bytes, and one 128 bytes past them
    assert validate(tma(128, 128, 6)) is None
    assert "232576 bytes of shared memory exceed 232448" in validate(tma(64, 144, 8))
    assert "3 or more stages" in validate(variant("sm_90a", kernel="wgmma", block_m=64,
                                                  block_n=64, stages=2))


def test_amd_mma_split_k_limits():
    """16 waves of 64 are the 1024 threads a block may have; the split-K sum takes split x
    the tile's accumulators in LDS, none unsplit; the lds kernel's 128 x 128 tile in 64 x 32
    waves stages 4 pieces a thread and K block."""
    from codegen.matrix import atom_for
    atom = atom_for("gfx942", "mma", "")
    assert validate(variant("gfx942", kernel="mma", block_m=16, block_n=16, split_k=16)) is None
    assert fam.mma_reduce_bytes(variant("gfx942", kernel="mma", block_m=16, block_n=16,
                                        split_k=8), atom) == 8 * 16 * 16 * 4
    assert fam.mma_reduce_bytes(variant("gfx942", kernel="mma", block_m=16, block_n=16), atom) == 0
    lds = variant("gfx942", kernel="lds", block_m=128, block_n=128, stages=2, wave_tile="w64x32")
    assert (fam.block_threads(lds), fam.lds_pieces(lds)) == (512, 4)
    assert not fam.swapped(variant("gfx942", kernel="mma", block_m=16, block_n=16))


def test_tuner_incumbent_and_plausible_edges():
    """The incumbent is what dispatch picks on the device's CUs (an MI300X partition picks
    otherwise than the full part); a 16-row mma tile is a candidate down to M = 1."""
    from codegen import tune

    mma = [c for c in tune.candidates("gfx942") if c["kernel"] == "mma"]
    assert fam.pick("gfx942", 1024, 3000, 4096, 38) != fam.pick("gfx942", 1024, 3000, 4096)
    for cus in (38, None):
        assert tune.incumbent("gfx942", 1024, 3000, 4096, mma, cus) == \
            fam.pick("gfx942", 1024, 3000, 4096, cus)
    assert all(tune.plausible(fam.config("mma", 16, 16), m) for m in (1, 8, 16))
    assert not tune.plausible(fam.config("mma", 32, 16), 16)
