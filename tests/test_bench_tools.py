"""The bench's report and its optional peers, without a GPU."""
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from codegen import bench_report, peers

ROOT = Path(__file__).resolve().parent.parent


def _run():
    row = dict(t=4096, h=4096, graph_us=10.0, us=12.0, copy_frac=0.9, compile_graph_us=20.0,
               vs_compile=2.0)
    return dict(date="d", device="dev", torch="t", copy_graph_gbs=4000.0, copy_gbs=3900.0,
                rmsnorm_quant=[dict(row, op="rmsnorm_group_quant", aiter_graph_us=9.0,
                                    vs_aiter=0.9),
                               dict(row, op="rmsnorm_group_quant", t=8192)])


def test_report_shows_a_peer_where_the_run_timed_it():
    text = bench_report.tables(_run(), "x.json")
    header = next(line for line in text.splitlines() if "AITER Triton graph" in line)
    assert header.count("|") == 10
    assert "| 4096 | 4096 | 10 | 90% | 12 | 20 | 2 | 9 | 0.9 |" in text
    assert "| 8192 | 4096 | 10 | 90% | 12 | 20 | 2 | n/a | n/a |" in text
    assert "0.90x AITER Triton" in bench_report.summary(_run())


def test_report_names_a_run_without_programmatic_launch():
    run = dict(_run(), pdl=False)
    assert "CODEGEN_PDL=0" in bench_report.tables(run, "x.json")
    assert "CODEGEN_PDL=0" in bench_report.summary(run)
    assert "CODEGEN_PDL" not in bench_report.tables(dict(_run(), pdl=True), "x.json")


def test_report_shows_the_same_size_copy_where_timed():
    run = _run()
    assert "same-size" not in bench_report.summary(run)
    run["rmsnorm_quant"][0].update(same_copy_graph_us=8.5, same_copy_frac=0.85)
    text = bench_report.tables(run, "x.json")
    assert "| 4096 | 4096 | 10 | 90% | 85% | 12 | 20 | 2 | 9 | 0.9 |" in text
    assert "| 8192 | 4096 | 10 | 90% | - | 12 |" in text
    assert "(85% of a same-size copy)" in bench_report.summary(run)


def test_report_shows_decode_on_untuned_shapes_where_timed():
    run = _run()
    assert "no table has" not in bench_report.tables(run, "x.json")
    run["decode"] = [dict(op="gemm", m=1, n=6144, k=4096, graph_us=8.0, us=13.0,
                          weight_copy_frac=0.79, same_copy_frac=0.95, config="gemv 1x8 sk1 s1")]
    assert "| 6144 | 4096 | 8 | 79% | 95% | 13 | gemv 1x8 sk1 s1 |" in bench_report.tables(
        run, "x.json")
    assert ("M = 1 on shapes no table has: weights read at 79% of copy, 95% of a same-size copy"
            in bench_report.summary(run))


def test_a_range_below_zero_reads_as_one():
    assert bench_report._span([0.05, 0.9]) == "5%-90%"
    assert bench_report._span([-1.3, 3.3], "{:.1f}") == "-1.3 to 3.3"


def test_report_has_no_peer_column_without_peer_figures():
    run = _run()
    del run["rmsnorm_quant"][0]["aiter_graph_us"], run["rmsnorm_quant"][0]["vs_aiter"]
    assert "AITER" not in bench_report.tables(run, "x.json")
    assert "AITER" not in bench_report.summary(run)


@pytest.fixture
def fresh_peers(monkeypatch):
    monkeypatch.delenv("CODEGEN_AITER", raising=False)
    monkeypatch.delenv("CODEGEN_VLLM", raising=False)
    yield monkeypatch
    importlib.reload(peers)


def test_peers_are_absent_unless_a_checkout_is_named(fresh_peers):
    importlib.reload(peers)
    assert peers.aiter() is None and peers.vllm_quant() is None


def test_a_broken_checkout_is_reported_not_raised(fresh_peers, tmp_path, capsys):
    fresh_peers.setenv("CODEGEN_AITER", str(tmp_path))
    fresh_peers.setenv("CODEGEN_VLLM", str(tmp_path))
    importlib.reload(peers)
    assert peers.aiter() is None and peers.vllm_quant() is None
    err = capsys.readouterr().err
    assert "AITER" in err and "vLLM" in err


def test_the_vllm_kernel_is_taken_out_of_its_module_alone(fresh_peers, tmp_path):
    pytest.importorskip("triton")
    src = tmp_path / peers._VLLM_FILE
    src.parent.mkdir(parents=True)
    # A module that cannot be imported here (no vLLM), holding a kernel of that name.
    src.write_text("import vllm.envs\nfrom vllm.triton_utils import tl, triton\n\n\n"
                   "@triton.jit\ndef _per_token_group_quant_fp8(y_ptr, BLOCK: tl.constexpr):\n"
                   "    tl.store(y_ptr, 0)\n\n\ndef other():\n    raise RuntimeError\n")
    fresh_peers.setenv("CODEGEN_VLLM", str(tmp_path))
    importlib.reload(peers)
    assert callable(peers.vllm_quant())


def test_a_report_of_another_device_goes_to_files_of_its_own(tmp_path, monkeypatch):
    """A second device's runs make their own page and plot; the record's are left alone."""
    (tmp_path / "r.json").write_text(json.dumps(dict(_run(), date="2026-12-01")))
    page = tmp_path / "page.md"
    page.write_text("<!-- bench-summary:begin -->\n<!-- bench-summary:end -->\n"
                    "<!-- bench:begin -->\n<!-- bench:end -->\n")
    plots = []
    monkeypatch.setattr(bench_report, "roofline", lambda run, path: plots.append(path))
    assert bench_report.main([str(tmp_path / "r.json"), "--tables", str(page), "--readme",
                              str(page), "--plot", str(tmp_path / "p.png")]) == 0
    assert plots == [tmp_path / "p.png"]
    text = page.read_text()
    assert "rmsnorm_group_quant (bf16, G 128)" in text and "Raw figures:" in text


def test_report_takes_each_section_from_the_newest_run_that_has_it(tmp_path):
    row = _run()["rmsnorm_quant"][1]
    older = dict(_run(), date="2026-12-01", commit="aaa", quant=[dict(row, g=128, us=99.0)])
    newer = dict(date="2026-12-01", time="10:00:00", device="dev", torch="t", commit="bbb",
                 copy_graph_gbs=4100.0, copy_gbs=3950.0, quant=[dict(row, g=128, us=11.0)])
    (tmp_path / "a.json").write_text(json.dumps(newer))
    (tmp_path / "b.json").write_text(json.dumps(older))
    run = bench_report.latest(sorted(tmp_path.glob("*.json")))
    assert run["quant"] == newer["quant"] and run["rmsnorm_quant"] == older["rmsnorm_quant"]
    assert run["commit"] == "bbb" and run["copy_graph_gbs"] == 4100.0
    assert [(s["commit"], s["sections"]) for s in run["sources"]] == [
        ("bbb", ["quant"]), ("aaa", ["rmsnorm_quant"])]
    header = bench_report.tables(run, "-").splitlines()[0]
    assert "quant from the run of 2026-12-01" in header and "commit aaa" in header
    assert ("quant 2026-12-01 at bbb (copy 4100 GB/s); rmsnorm_quant 2026-12-01 at aaa (copy "
            "4000 GB/s)") in bench_report.summary(run)


def test_a_run_of_a_few_cells_replaces_only_those(tmp_path):
    cell = lambda m, us: dict(op="gemm", m=m, n=576, k=7168, graph_us=us)   # noqa: E731
    older = dict(_run(), date="2026-12-01", commit="aaa", gemm=[cell(1, 5.0), cell(128, 9.0)])
    newer = dict(_run(), date="2026-12-02", commit="bbb", gemm=[cell(128, 8.0), cell(64, 7.0)],
                 copy_graph_gbs=4100.0)
    del newer["rmsnorm_quant"]
    (tmp_path / "a.json").write_text(json.dumps(older))
    (tmp_path / "b.json").write_text(json.dumps(newer))
    run = bench_report.latest(sorted(tmp_path.glob("*.json")))
    assert [(r["m"], r["graph_us"]) for r in run["gemm"]] == [(1, 5.0), (128, 8.0), (64, 7.0)]
    assert [(s["commit"], s["sections"]) for s in run["sources"]] == [
        ("bbb", ["gemm"]), ("aaa", ["rmsnorm_quant", "gemm (other cells)"])]
    # the plot's ceilings: each family's own run's copy
    assert bench_report._copy_for(run, "gemm") == 4100.0
    assert bench_report._copy_for(run, "rmsnorm_quant") == 4000.0


def test_inputs_rotate_past_the_last_cache(monkeypatch):
    """MI300X-class parts report their 4 MiB L2 but keep 256 MiB in the Infinity Cache."""
    from types import SimpleNamespace

    from codegen import bench
    from codegen.targets import TARGETS

    monkeypatch.setattr(bench.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(bench.torch.cuda, "get_device_properties",
                        lambda d: SimpleNamespace(L2_cache_size=4 << 20))
    for arch, cache in (("gfx942", 256 << 20), ("gfx1201", 64 << 20), ("sm_80", 4 << 20)):
        monkeypatch.setattr(bench, "device_arch", lambda d, a=arch: a)
        assert bench.cache_bytes() == cache, arch
    for t in TARGETS.values():
        for nbytes in (3 << 20, 30 << 20, 300 << 20, 3 << 30):
            n = bench.sets_for(nbytes, t.cache_bytes)
            assert n >= 2 and n * nbytes > 2 * t.cache_bytes, (t.arch, nbytes)


def test_a_report_is_of_one_device(tmp_path):
    h200 = dict(_run(), date="2026-12-01", device="NVIDIA H200", commit="aaa")
    mi300 = dict(_run(), date="2026-12-02", device="AMD Instinct MI300X", commit="bbb")
    del mi300["rmsnorm_quant"][1]
    (tmp_path / "h200.json").write_text(json.dumps(h200))
    (tmp_path / "mi300x.json").write_text(json.dumps(mi300))
    run = bench_report.latest(sorted(tmp_path.glob("*.json")))
    assert run["device"] == "AMD Instinct MI300X" and len(run["rmsnorm_quant"]) == 1
    assert [s["commit"] for s in run["sources"]] == ["bbb"]


@pytest.mark.gpu
def test_graph_calls_write_rotating_outputs(monkeypatch):
    """Each call of a timed graph writes a buffer that the call before it did not: the outputs
    rotate as the inputs do, so no contender's writes land in a still-cached buffer."""
    import torch

    from codegen import bench

    monkeypatch.setattr(bench, "input_sets", lambda nbytes: 3)
    ptrs = []

    def make():
        def call():
            y = torch.zeros(1 << 16, device="cuda")   # a kernel: the graph is not empty
            ptrs.append(y.data_ptr())
            return y
        return call

    bench._graph(make, 1 << 18, min_calls=12)
    captured = ptrs[3:]          # the first 3 ran before the capture
    assert len(captured) == 12
    assert all(a != b for a, b in zip(captured, captured[1:]))
    # a buffer comes back only after every other call's output was held once
    assert all(len(set(captured[i:i + 4])) == 4 for i in range(len(captured) - 3))


def test_source_digest_names_the_tree(tmp_path):
    """A run records a hash of codegen/ and templates/: equal for equal files, bytecode aside,
    and different for any change of a name or a byte."""
    from codegen.bench import source_digest

    for top in ("codegen", "templates"):
        (tmp_path / top / "__pycache__").mkdir(parents=True)
        (tmp_path / top / "a.txt").write_text("one")
    first = source_digest(str(tmp_path))
    (tmp_path / "codegen" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (tmp_path / "README.md").write_text("outside")
    assert source_digest(str(tmp_path)) == first
    (tmp_path / "templates" / "a.txt").write_text("two")
    assert source_digest(str(tmp_path)) != first
    (tmp_path / "templates" / "a.txt").write_text("one")
    (tmp_path / "templates" / "a.txt").rename(tmp_path / "templates" / "b.txt")
    assert source_digest(str(tmp_path)) != first


def test_gemm_scales_in_the_quant_ops_layouts():
    import torch

    from codegen.bench import a_scales_as

    sa = torch.rand(7, 5)
    assert a_scales_as(sa, "row") is sa
    col = a_scales_as(sa, "col_tma")
    assert col.stride() == (1, 8) and torch.equal(col, sa)
    with pytest.raises(ValueError, match="layout"):
        a_scales_as(sa, "col")


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ab_gemm_reads_its_cells():
    ab = _tool("ab_gemm")
    assert ab.parse_cell("1024x24576x1536:tma:128x128:s4:c2") == (
        (1024, 24576, 1536), dict(kernel="tma", block_m=128, block_n=128, stages=4, cluster=2))
    assert ab.parse_cell("1x7168x2048:mma:8x16:k4") == (
        (1, 7168, 2048), dict(kernel="mma", block_m=8, block_n=16, split_k=4))
    with pytest.raises(ValueError, match="MxNxK:kernel:BMxBN"):
        ab.parse_cell("1024x4096:tma:128x128")


def test_ab_gemm_takes_the_old_tree_from_a_folder(tmp_path, monkeypatch, capsys):
    """--old naming a folder runs the old workers there, with no git archive (a copy of the
    tree without its history); each tree's worker gets its own PYTHONPATH and caches."""
    ab = _tool("ab_gemm")
    calls = []

    def run(cmd, env=None, **kw):
        calls.append((cmd, env))
        assert cmd[0] == sys.executable, f"only the workers may run, not {cmd[:2]}"
        us = "10.0" if env["PYTHONPATH"] == str(tmp_path) else "8.0"
        return subprocess.CompletedProcess(cmd, 0, stdout=f"ab {cmd[3]} 64x64x128:tma:64x64:s4 {us}\n",
                                           stderr="")

    monkeypatch.setattr(ab.subprocess, "run", run)
    assert ab.main(["--old", str(tmp_path), "--rounds", "1", "64x64x128:tma:64x64:s4"]) == 0
    paths = [env["PYTHONPATH"] for _, env in calls]
    assert paths == [str(tmp_path), str(ab.ROOT)]
    assert len({env["CODEGEN_CACHE_DIR"] for _, env in calls}) == 2
    assert "| 64x64x128:tma:64x64:s4 | 10.0 | 8.0 | 1.250 |" in capsys.readouterr().out


def test_ab_gemm_stops_a_worker_that_hangs(tmp_path, monkeypatch, capsys):
    """A worker past --timeout (a kernel that never returns) is stopped: the cells it timed
    count, the others show "timed out", and the next worker still runs."""
    ab = _tool("ab_gemm")
    cells = ["64x64x128:tma:64x64:s4", "128x64x128:tma:64x64:s4"]

    def run(cmd, env=None, timeout=None, **kw):
        if env["PYTHONPATH"] == str(tmp_path):
            return subprocess.CompletedProcess(
                cmd, 0, stdout="".join(f"ab old {c} 10.0\n" for c in cells), stderr="")
        raise subprocess.TimeoutExpired(cmd, timeout, output=f"ab new {cells[0]} 8.0\n".encode())

    monkeypatch.setattr(ab.subprocess, "run", run)
    assert ab.main(["--old", str(tmp_path), "--rounds", "1", "--timeout", "5", *cells]) == 0
    out = capsys.readouterr()
    assert f"| {cells[0]} | 10.0 | 8.0 | 1.250 |" in out.out
    assert f"| {cells[1]} | 10.0 | timed out | - |" in out.out
    assert "the new worker ran past 5 s" in out.err


def test_power_gemm_reads_its_arguments():
    pg = _tool("power_gemm")
    assert pg.parse_shapes("4096x7168x16384,1x2x3") == [(4096, 7168, 16384), (1, 2, 3)]
    for bad in ("4096x7168", "0x1x1", "ax1x1"):
        with pytest.raises(ValueError, match="MxNxK"):
            pg.parse_shapes(bad)
    assert pg.parse_contender("cublas") is None
    assert pg.parse_contender("tma:128x128:s5:c2") == dict(kernel="tma", block_m=128,
                                                           block_n=128, stages=5, cluster=2)
    with pytest.raises(ValueError, match="contender 'tma:128'"):
        pg.parse_contender("tma:128")
    with pytest.raises(SystemExit):   # argparse names the bad shape before torch is imported
        pg.main(["1x2", "cublas"])


def test_power_gemm_takes_the_settled_samples():
    pg = _tool("power_gemm")
    assert pg.parse_sample("1380, 692.13\n") == (1380.0, 692.13)
    assert pg.parse_sample("[N/A], 692.13") is None and pg.parse_sample("") is None
    samples = [(10.0, 1980.0, 300.0), (10.4, 1900.0, 500.0),   # the first 0.5 s: left out
               (10.6, 1400.0, 690.0), (11.0, 1380.0, 692.0), (11.5, 1390.0, 694.0),
               (13.0, 1700.0, 400.0)]                          # after the window
    assert pg.window(samples, 10.0, 12.0) == (1390.0, 692.0)
    clock, watts = pg.window(samples, 20.0, 21.0)
    assert clock != clock and watts != watts   # nothing sampled: nan


def test_trace_tma_instruments_the_current_template(tmp_path):
    tt = _tool("trace_tma")
    tree = tt.instrumented_tree(tmp_path / "tree")   # each edit found exactly once, or it exits
    text = (tree / tt.TEMPLATE).read_text()
    assert "g_trace[call][blockIdx.x][4] = now_ns();" in text and "trace_dump" in text
    assert (ROOT / tt.TEMPLATE).read_text().count("g_trace") == 0   # the checkout untouched
    cell = "1024x4096x7168:tma:128x128:s6"
    for bad in (["1x2x3:mma:8x8"], ["--map", "1,x", cell], ["--map", "0", cell],
                ["--trigger", "2", cell], ["--trigger", ",1", cell]):
        with pytest.raises(SystemExit):
            tt.main(bad)


def test_torch_compile_peers_take_one_static_graph_per_shape():
    """torch.compile's default turns a function seen at a second shape symbolic; the peers are
    compiled once per shape, each graph specialized to it."""
    import torch
    import torch._dynamo

    from codegen.bench import peer_compile

    graphs = []

    def record(gm, example_inputs):
        graphs.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        assert all(isinstance(d, int) for t in example_inputs if isinstance(t, torch.Tensor)
                   for d in t.shape), "symbolic sizes"
        return gm.forward

    torch._dynamo.reset()
    fn = peer_compile(lambda x: (x * x).sum(-1), backend=record)
    for t, h in ((1, 16), (16, 16), (16, 32), (64, 48)):
        fn(torch.ones(t, h))
    fn(torch.ones(16, 16))           # a shape seen before: no new graph
    assert graphs == [[(1, 16)], [(16, 16)], [(16, 32)], [(64, 48)]]


def test_a_run_is_named_by_its_card():
    from codegen.bench import card_name
    assert [card_name(d) for d in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X",
                                   "AMD Radeon AI PRO R9700", "Radeon")] == [
        "h200", "h100", "mi300x", "r9700", "radeon"]


@pytest.mark.parametrize("results,page,summary_page", [
    ("docs/bench", "docs/performance.md", "README.md"),
    ("docs/bench/h100", "docs/performance-h100.md", "docs/performance-h100.md")])
def test_the_committed_pages_are_what_the_report_makes_of_the_committed_runs(
        results, page, summary_page):
    """Every table and summary line of the README and the performance pages, as the report
    writes them from the JSONs beside them: a page edited by hand or left behind a new run, or a
    change to how the report writes a cell, fails here."""
    root = bench_report.ROOT

    def between(path, markers):
        return (root / path).read_text().split(markers[0] + "\n", 1)[1].split(markers[1], 1)[0]

    run = bench_report.latest(sorted((root / results).glob("*.json")))
    source = ", ".join(r["file"] for r in run["sources"])
    assert bench_report.tables(run, source) == between(page, (bench_report.BEGIN,
                                                              bench_report.END))
    assert bench_report.summary(run) == between(summary_page, bench_report.SUMMARY)


def _stand_in_graphs(monkeypatch, sets, jitter=()):
    """CUDA graphs, capture and events on a clock that a captured call advances by its cost
    on every replay; `jitter` ms added after each timed replay."""
    from types import SimpleNamespace

    from codegen import bench
    st = SimpleNamespace(clock=0.0, capture=None, replays=[], graphs=[], jitter=list(jitter))

    class Graph:
        def __init__(self):
            self.calls = []
            st.graphs.append(self)

        def replay(self):
            st.replays.append(st.graphs.index(self))
            for c in self.calls:
                c()
            if st.jitter and len(st.replays) > len(st.graphs):
                st.clock += st.jitter.pop(0)

    class Capture:
        def __init__(self, g):
            self.g = g

        def __enter__(self):
            st.capture = self.g

        def __exit__(self, *a):
            st.capture = None

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = st.clock

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.t - self.t

    monkeypatch.setattr(bench.torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(bench.torch.cuda, "graph", Capture)
    monkeypatch.setattr(bench.torch.cuda, "Event", Event)
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "input_sets", lambda nbytes: sets)
    return st


def _costing(st, cost_us, calls_made):
    """A make whose calls cost cost_us each on the stand-in clock; calls_made[i] counts the
    calls of the i-th input set."""
    def make():
        i = len(calls_made)
        calls_made.append(0)

        def call():
            if st.capture is not None:
                st.capture.calls.append(lambda: setattr(st, "clock", st.clock + cost_us / 1e3))
            calls_made[i] += 1
            return object()
        return call
    return make


def test_graph_time_is_per_call_over_every_input_set(monkeypatch):
    """64 calls at least, each input set as often as the others (a warm-up each, then
    ceil(64 / 3) rounds); more sets than that: each once; the time is per call."""
    from codegen import bench
    for sets, per_set in ((3, 1 + 22), (100, 1 + 1)):
        st, made = _stand_in_graphs(monkeypatch, sets), []
        assert bench.graph_us(_costing(st, 2.0, made), 1 << 20) == pytest.approx(2.0)
        assert made == [per_set] * sets


def test_contenders_alternate_and_the_median_replay_counts(monkeypatch):
    from codegen import bench
    st = _stand_in_graphs(monkeypatch, 2)
    assert bench.graphs_us([_costing(st, 1.0, []), _costing(st, 3.0, [])], 1 << 20) == \
        pytest.approx([1.0, 3.0])
    assert st.replays == [0, 1] + [0, 1, 1, 0] * 3 + [0, 1]   # a warm-up, then 7 each in turn
    st = _stand_in_graphs(monkeypatch, 2, jitter=[0.009, 0.001, 0.005, 0.002, 0.008, 0.003,
                                                  0.020])
    # replays of 2 calls taking 9, 1, 5, 2, 8, 3, 20 ns more: the median, 5 / 2 ns a call
    assert bench.graphs_us([_costing(st, 0.0, [])], 1 << 20, min_calls=2) == \
        pytest.approx([2.5])


def test_input_sets_exceed_twice_the_cache_within_bounds(monkeypatch):
    from codegen import bench
    monkeypatch.setattr(bench, "cache_bytes", lambda: 4 << 20)
    assert bench.input_sets(1 << 20) == 9
    assert bench.sets_for(1024, 50 << 20) == 4096
    assert bench.sets_for(1 << 20, 0) == 2


@pytest.fixture
def bench_on_host(monkeypatch):
    """codegen.bench with the tensors it asks of the GPU made on the host, its torch.compile
    peers run as written and no AITER checkout."""
    import torch

    from codegen import bench
    for name in ("ones", "randn", "rand"):
        made = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *s, device=None, _f=made, **k: _f(*s, **k))
    monkeypatch.setattr(bench, "peer_compile", lambda fn: fn)
    monkeypatch.setattr(bench.peers, "aiter", lambda: None)
    return bench


def test_rmsnorm_cells_count_what_each_op_reads_and_writes(bench_on_host):
    """bf16: rmsnorm reads x and writes y (4 bytes an element), fused_add reads x and the
    residual and writes both (8)."""
    bench = bench_on_host
    cells = [c[:4] for c in bench._rmsnorm_cells([16, 4096], [7168])]
    assert cells == [("rmsnorm", 16, 7168, 16 * 7168 * 4),
                     ("fused_add_rmsnorm", 16, 7168, 16 * 7168 * 8),
                     ("rmsnorm", 4096, 7168, 4096 * 7168 * 4),
                     ("fused_add_rmsnorm", 4096, 7168, 4096 * 7168 * 8),
                     ("fused_add_rmsnorm, residual_out", 4096, 7168, 4096 * 7168 * 8)]


def test_unknown_sections_are_refused_before_a_gpu_is_asked_for():
    from codegen import bench
    with pytest.raises(SystemExit) as e:
        bench.main(["--sections", "quant,bogus"])
    assert e.value.code == 2


def test_quant_figures_are_bytes_over_graph_time_against_each_contender(monkeypatch,
                                                                        bench_on_host):
    """A quant cell moves x (2 bytes an element) in, q (1) and a 4-byte scale a group out; GB/s,
    the fraction of the graph copy and the ratios to each peer come from the graph times, the
    event ratios from the event times; the vLLM peer quantizes to the format's max."""
    from types import SimpleNamespace

    import torch

    bench, fp8 = bench_on_host, torch.float8_e4m3fn
    monkeypatch.setattr(bench, "ops", SimpleNamespace(
        per_token_group_quant_fp8=lambda x, g=128: (torch.zeros(1, dtype=fp8), None)))
    fmaxes, moved = [], []
    monkeypatch.setattr(bench.peers, "vllm_quant",
                        lambda: (lambda x, g, dt, fmax: fmaxes.append(fmax)))
    monkeypatch.setattr(bench, "_bf16", lambda t, h: None)

    def cell_us(makes, nbytes):     # (graph, event) of ours, torch.compile's, vLLM's
        moved.append(nbytes)
        makes[2]()()
        return [(10.0, 12.0), (20.0, 30.0), (15.0, 18.0)]
    monkeypatch.setattr(bench, "cell_us", cell_us)
    monkeypatch.setattr(bench, "same_size_copy_us", lambda nbytes: 8.0)
    rows = bench.quant_section({"graph": 2000.0, "event": 1000.0}, 2.0, quick=True)
    assert [(r["g"], r["t"], r["h"]) for r in rows] == [
        (g, t, 7168) for g in (128, 64) for t in (1, 16, 8192)]
    assert moved == [t * 7168 * 3 + t * 7168 // g * 4 for g in (128, 64) for t in (1, 16, 8192)]
    r = rows[2]
    assert r["gbs"] == pytest.approx(moved[2] / 10.0 / 1e3)
    assert r["copy_frac"] == pytest.approx(moved[2] / 10.0 / 1e3 / 2000.0)
    assert (r["vs_compile"], r["vs_vllm"], r["vs_vllm_event"]) == (2.0, 1.5, 1.5)
    assert r["same_copy_frac"] == 0.8 and "same_copy_frac" not in rows[5]   # G 128 only
    assert fmaxes == [448.0] * 6


@pytest.mark.parametrize("m, cublas", [(4096, True), (1, False)])
def test_gemm_figures_are_flops_and_weight_bytes_over_graph_time(monkeypatch, bench_on_host,
                                                                  m, cublas):
    """A GEMM cell moves A, B (the weights) and a bf16 out; TFLOP/s is 2 M N K over the graph
    time, the weight rate N K bytes over it against the graph copy, the ratio to cuBLAS its
    graph (event) time over ours; at M = 1 the weights against a same-size copy; the config
    is the one dispatch picks on the device."""
    from types import SimpleNamespace

    import torch

    from codegen.families import gemm as fam
    bench, n, k = bench_on_host, 2112, 7168
    monkeypatch.setattr(bench, "device_arch", lambda d: "sm_90a")
    out = torch.ones(m, n)
    monkeypatch.setattr(bench, "ops", SimpleNamespace(
        gemm=SimpleNamespace(fp8_dtype_of=lambda arch: torch.float8_e4m3fn),
        gemm_a8w8_blockscale=lambda *t: out))
    monkeypatch.setattr(bench, "_cublas_blockwise",
                        lambda *t: (lambda: out) if cublas else None)
    monkeypatch.setattr("codegen.ops._common.multiprocessors", lambda t: 132)
    moved = []

    def cell_us(makes, nbytes):
        moved.append(nbytes)
        return [(100.0, 110.0), (120.0, 143.0)][:len(makes)]
    monkeypatch.setattr(bench, "cell_us", cell_us)
    copies = []
    monkeypatch.setattr(bench, "same_size_copy_us", lambda nbytes: copies.append(nbytes) or 80.0)
    r = bench._gemm_cell(m, n, k, {"graph": 4000.0, "event": 3000.0})
    assert moved == [m * k + n * k + m * n * 2]
    assert r["tflops"] == pytest.approx(2 * m * n * k / 100.0 / 1e6)
    assert r["weight_gbs"] == pytest.approx(n * k / 100.0 / 1e3)
    assert r["weight_copy_frac"] == pytest.approx(n * k / 100.0 / 1e3 / 4000.0)
    if cublas:
        assert (r["vs_cublas"], r["vs_cublas_event"]) == (1.2, 1.3)
        assert r["cublas_tflops"] == pytest.approx(2 * m * n * k / 120.0 / 1e6)
        assert "same_copy_frac" not in r
    else:
        assert r["vs_cublas"] is None and r["same_copy_frac"] == 0.8 and copies == [n * k]
    c = fam.pick("sm_90a", m, n, k, 132)
    assert r["config"].startswith(f"{c['kernel']} {c['block_m']}x{c['block_n']} "
                                  f"sk{c['split_k']} s{c['stages']}")


def test_rmsnorm_quant_cells_count_what_each_op_moves(monkeypatch, bench_on_host):
    """rmsnorm_group_quant moves what the quant does (x in, q and the G = 128 scales out; the
    weight stays in cache); the dual op's q rows as that, its kv rows of 512 in and out in
    bf16; only T, H >= 4096 against a same-size copy; the dual's speedup is two launches'
    time over one's."""
    from types import SimpleNamespace

    import torch

    bench = bench_on_host
    monkeypatch.setattr(bench, "ops", SimpleNamespace(
        per_token_group_quant_fp8=lambda x: (torch.zeros(1, dtype=torch.float8_e4m3fn), None)))
    moved = []
    monkeypatch.setattr(bench, "cell_us", lambda makes, nbytes: moved.append(nbytes) or [
        (10.0, 12.0), (20.0, 30.0)])
    monkeypatch.setattr(bench, "same_size_copy_us", lambda nbytes: 8.0)
    rows = bench.rmsnorm_quant_section({"graph": 2000.0, "event": 1000.0})
    cells = ((16, 7168), (256, 7168), (4096, 4096), (4096, 7168), (16384, 7168))
    dual = [(t, g) for t in (1, 16, 64, 256) for g in (128, 64)]
    assert moved == [t * h * 3 + t * h // 128 * 4 for t, h in cells] + [
        t * (1536 * 3 + 512 * 4) + t * 1536 // g * 4 for t, g in dual]
    assert [("same_copy_frac" in r) for r in rows[:5]] == [False, False, True, True, True]
    assert rows[5]["speedup"] == 2.0 and rows[5]["speedup_event"] == 2.5


def test_host_time_is_per_call_and_the_median_round(monkeypatch):
    """host_us: wall time per call of a loop of n calls, the median over rounds; a case whose
    calls slow down in one round reads as its usual self."""
    from codegen import bench
    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    calls = {"a": 0}

    def a():                       # 2 us a call, 50 us a call in its 6th round of loops
        calls["a"] += 1
        clock[0] += (50e-6 if 1 + 5 * 10 < calls["a"] <= 1 + 6 * 10 else 2e-6)

    def b():
        clock[0] += 7e-6
    us = bench.host_us({"a": a, "b": b}, n=10, rounds=7)
    assert us == {"a": pytest.approx(2.0), "b": pytest.approx(7.0)}


@pytest.mark.parametrize("pdl_env,pdl", [(None, True), ("0", False), ("1", True)])
def test_a_run_records_its_cache_bound_and_launch_mode(monkeypatch, tmp_path, pdl_env, pdl):
    """The JSON of a run names what its inputs rotated past (twice the last cache) and whether
    our launches overlapped (programmatic dependent launch, off with CODEGEN_PDL=0)."""
    from codegen import bench
    if pdl_env is None:
        monkeypatch.delenv("CODEGEN_PDL", raising=False)
    else:
        monkeypatch.setenv("CODEGEN_PDL", pdl_env)
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(bench._fast, "module", lambda wait=False: None)
    monkeypatch.setattr(bench, "cache_bytes", lambda: 60 << 20)
    for name, value in (("copy_bandwidth", 4000.0), ("copy_bandwidth_graph", 4100.0),
                        ("empty_kernel_us", 2.0)):
        monkeypatch.setattr(bench, name, lambda v=value: v)
    monkeypatch.setattr(bench, "source_commit", lambda: "abc")
    monkeypatch.setattr(bench, "jit_section", lambda: {"first_call_s": 1.0})
    assert bench.main(["--sections", "jit", "--json", str(tmp_path) + "/"]) == 0
    (path,) = tmp_path.glob("h200-*.json")
    run = json.loads(path.read_text())
    assert run["rotated_past_bytes"] == 120 << 20 and run["pdl"] is pdl
    assert run["copy_graph_gbs"] == 4100.0 and run["jit"] == {"first_call_s": 1.0}


def test_host_overhead_is_each_call_past_a_bare_launch(capsys):
    from codegen import bench
    figures = bench.overhead_figures({"torch.mul(out=)": 2.5, "torch.mul": 4.0, "rmsnorm": 6.0})
    assert figures == {"calls_us": {"torch.mul(out=)": 2.5, "torch.mul": 4.0, "rmsnorm": 6.0},
                       "bare_launch_us": 2.5,
                       "overhead_us": {"torch.mul(out=)": 0.0, "torch.mul": 1.5, "rmsnorm": 3.5}}
    assert "rmsnorm" in capsys.readouterr().out


@pytest.mark.parametrize("kb", [4, 7, 56])
def test_cublas_is_given_the_blockwise_scale_layouts_torch_expects(monkeypatch, kb):
    """scale_a [M, K/128] column-major; B [K, N] column-major; scale_b [round_up(K/128, 4),
    N/128] with strides (1, that rounded K/128), past K/128 zeros (TARGETS.md)."""
    import torch

    from codegen import bench
    m, nb = 5, 3
    a = torch.zeros(m, kb * 128, dtype=torch.float8_e4m3fn)
    b = torch.zeros(nb * 128, kb * 128, dtype=torch.float8_e4m3fn)
    sa, sb = torch.rand(m, kb), torch.rand(nb, kb)
    seen = {}

    def scaled_mm(x, y, scale_a, scale_b, out_dtype):
        seen.update(x=x, y=y, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    assert bench._cublas_blockwise(a, sa, b, sb) is not None
    kr = -(-kb // 4) * 4
    assert seen["x"] is a and seen["y"].shape == (kb * 128, nb * 128)
    assert seen["y"].stride() == (1, kb * 128)
    assert torch.equal(seen["scale_a"], sa) and seen["scale_a"].stride() == (1, m)
    scale_b = seen["scale_b"]
    assert scale_b.shape == (kr, nb) and scale_b.stride() == (1, kr)
    assert torch.equal(scale_b[:kb], sb.t()) and not scale_b[kb:].any()
    assert seen["out_dtype"] == torch.bfloat16


def test_cublas_is_left_out_where_torch_refuses_the_shape(monkeypatch):
    import torch

    from codegen import bench

    def refuse(*a, **k):
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    a = torch.zeros(1, 256, dtype=torch.float8_e4m3fn)
    assert bench._cublas_blockwise(a, torch.ones(1, 2), a, torch.ones(1, 2)) is None


def test_kernel_time_is_the_kernels_per_call_without_the_cache_flush(monkeypatch):
    """kernel_us: the profiler's CUDA kernel records of n calls, less the flushes between them
    ("Fill"), over n; the host's records do not count."""
    import contextlib
    from types import SimpleNamespace

    import torch
    import torch.profiler

    from codegen import bench
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = []
    made = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *s, device=None, **k: made(1, **k))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    @contextlib.contextmanager
    def profile(activities):
        events.clear()            # the records of the calls made within
        yield SimpleNamespace(events=lambda: events)
    monkeypatch.setattr(torch.profiler, "profile", profile)

    def fn():
        events.extend([SimpleNamespace(name="gemm", device_type=cuda, device_time=3.0),
                       SimpleNamespace(name="scale", device_type=cuda, device_time=1.0),
                       SimpleNamespace(name="aten::mm", device_type=cpu, device_time=50.0)])
    real_zero = torch.Tensor.zero_
    monkeypatch.setattr(torch.Tensor, "zero_", lambda t: events.append(SimpleNamespace(
        name="void at::native::vectorized_elementwise_kernel<FillFunctor>", device_type=cuda,
        device_time=9.0)) or real_zero(t))
    assert bench.kernel_us(fn, n=5) == pytest.approx(4.0)
