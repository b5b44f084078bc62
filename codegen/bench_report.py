"""Performance tables, the README's summary of them and the roofline plot, from `make bench`
JSONs.

    python -m codegen.bench_report [docs/bench/<run>.json ...]    (default: every one there)

Each cell comes from the newest run of the newest run's device that has it (by date, then time
of day), so a run of one section (`--sections gemm`, `--gemm-ms`) supersedes only its cells.

Rewrites docs/performance.md between its `<!-- bench:begin -->` / `<!-- bench:end -->` markers
(every table), the README between `<!-- bench-summary:begin -->` / `<!-- bench-summary:end -->`
(one line per op family) and writes docs/bench/roofline.png (matplotlib, when installed). Needs
no GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "bench"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
SUMMARY = ("<!-- bench-summary:begin -->", "<!-- bench-summary:end -->")


def _f(v, digits=3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _table(cols: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_f(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# Optional peers (codegen/peers.py): (JSON key prefix, column label), shown where a run has them.
PEERS = (("vllm", "vLLM Triton"), ("aiter", "AITER Triton"),
         ("compile_inplace", "torch.compile in place"))


def _peer_cols(rows: list[dict]) -> tuple[list[str], callable]:
    """The peer columns present in rows, and a function giving a row's cells for them."""
    present = [(k, label) for k, label in PEERS if any(f"{k}_graph_us" in r for r in rows)]
    cols = [c for _, label in present for c in (f"{label} graph", f"x {label}")]
    return cols, lambda r: [r.get(c) for k, _ in present for c in (f"{k}_graph_us", f"vs_{k}")]


def _same_copy_cols(rows: list[dict]) -> tuple[list[str], callable]:
    """The "of same-size copy" column where the run timed one (large cells only)."""
    if not any("same_copy_frac" in r for r in rows):
        return [], lambda r: []
    return ["of same-size copy"], lambda r: [
        f"{r['same_copy_frac']:.0%}" if "same_copy_frac" in r else "-"]


def _quant_table(title: str, rows: list[dict]) -> list[str]:
    """A T x H table of a quantizing op: ours, of copy, event time, torch.compile, peers."""
    pc, pv = _peer_cols(rows)
    sc, sv = _same_copy_cols(rows)
    return ["", title, "", _table(
        ["T", "H", "graph", "of copy"] + sc + ["event", "torch.compile graph", "x compile"] + pc,
        [[r["t"], r["h"], r["graph_us"], f"{r['copy_frac']:.0%}"] + sv(r)
         + [r["us"], r["compile_graph_us"], r["vs_compile"]] + pv(r) for r in rows])]


SECTIONS = ("jit", "overhead", "quant", "rmsnorm", "rmsnorm_quant", "gemm", "decode",
            "rmsnorm_kernels")


def _meta(run: dict) -> dict:
    return {k: v for k, v in run.items() if k not in SECTIONS and k != "sources"}


CELL = ("op", "g", "t", "h", "m", "n", "k", "a_scales")   # the fields that name a row's cell


def _cell(row: dict) -> tuple:
    return tuple(row.get(f) for f in CELL)


def latest(paths: list[Path]) -> dict:
    """One run from several: each cell of a section from the newest run that has it (in the
    order of the oldest run listing it; a run of a few cells replaces only those), the other
    fields from the newest run; "sources" lists, newest first, each run used and its sections
    ("gemm (other cells)" where a newer run had some of them). Only the newest run's device
    is reported: an MI300X run beside H200 ones makes an MI300X report."""
    runs = sorted(((json.loads(p.read_text()), p) for p in paths),
                  key=lambda rp: (rp[0]["date"], rp[0].get("time", ""), rp[1].name))
    runs = [rp for rp in runs if rp[0]["device"] == runs[-1][0]["device"]]
    out = _meta(runs[-1][0]) if runs else {}
    out["sources"] = []
    for run, path in reversed(runs):
        took = []
        for s in (s for s in SECTIONS if s in run):
            if s not in out:
                out[s] = run[s]
                took.append(s)
            elif isinstance(run[s], list):
                newer = {_cell(r): r for r in out[s]}
                if any(_cell(r) not in newer for r in run[s]):
                    took.append(f"{s} (other cells)")
                out[s] = [newer.pop(_cell(r), r) for r in run[s]] + list(newer.values())
        if took:
            try:
                path = path.resolve().relative_to(ROOT)
            except ValueError:
                pass
            out["sources"].append(dict(_meta(run), file=str(path), sections=took))
    return out


def _pdl_off(run: dict) -> str:
    return ", CODEGEN_PDL=0" if run.get("pdl") is False else ""


def _run_line(run: dict, what: str, source: str) -> str:
    return (f"{what}{run['date']} on {run['device']} (torch {run['torch']}"
            f"{', commit ' + run['commit'] if run.get('commit') else ''}"
            f"{_pdl_off(run)}): copy "
            f"{run['copy_graph_gbs']:.0f} GB/s by graph time, {run['copy_gbs']:.0f} GB/s by "
            f"events. Raw figures: `{source}`.")


def tables(run: dict, source: str) -> str:
    sources = run.get("sources") or [dict(_meta(run), file=source, sections=[])]
    lines = [_run_line(r, f"{', '.join(r['sections'])} from the run of " if len(sources) > 1
                       else "Run of ", r["file"]) for r in sources]
    out = [" ".join(lines) + " Every \"of copy\" is against that run's graph copy (235 MB "
           "moved), \"of same-size copy\" against a copy moving the cell's bytes. Times in us; "
           "\"graph\" is the per-call time in a CUDA graph over rotating inputs and outputs, "
           "\"event\" one call with its launch; peers are timed the same way in the same run."]
    if run.get("quant"):
        out += _quant_table("**per_token_group_quant_fp8** (bf16 in, G = 128)",
                            [r for r in run["quant"] if r["g"] == 128])
    if run.get("rmsnorm"):
        pc, pv = _peer_cols(run["rmsnorm"])
        out += ["", "**rmsnorm / fused_add_rmsnorm** (bf16)", "", _table(
            ["op", "T", "H", "graph", "of copy", "event", "torch.compile graph", "x compile"]
            + pc, [[r["op"], r["t"], r["h"], r["graph_us"], f"{r['copy_frac']:.0%}", r["us"],
                    r["compile_graph_us"], r["vs_compile"]] + pv(r) for r in run["rmsnorm"]])]
    if run.get("rmsnorm_quant"):
        rgq = [r for r in run["rmsnorm_quant"] if r["op"] == "rmsnorm_group_quant"]
        dual = [r for r in run["rmsnorm_quant"] if r["op"] == "dual_rmsnorm_group_quant"]
        out += _quant_table("**rmsnorm_group_quant** (bf16 in, G = 128)", rgq)
        out += ["", "**dual_rmsnorm_group_quant** (q 1536 + kv 512): one launch against "
                "rmsnorm_group_quant + rmsnorm", "", _table(
                    ["T", "G", "one, graph", "two, graph", "speedup", "one, event",
                     "two, event"],
                    [[r["t"], r["g"], r["graph_us"], r["separate_graph_us"], r["speedup"],
                      r["us"], r["separate_us"]] for r in dual])]
    if run.get("gemm"):
        out += ["", "**gemm_a8w8_blockscale** (bf16 out) against cuBLAS blockwise "
                "(torch._scaled_mm, 1x128 / 128x128), graph time", "", _table(
                    ["M", "N", "K", "graph", "TFLOP/s", "cuBLAS TFLOP/s", "x cuBLAS",
                     "weights, of copy", "weights, of same-size copy", "event", "config"],
                    [[r["m"], r["n"], r["k"], r["graph_us"], r["tflops"], r["cublas_tflops"],
                      r["vs_cublas"], f"{r['weight_copy_frac']:.0%}",
                      f"{r['same_copy_frac']:.0%}" if "same_copy_frac" in r else "-", r["us"],
                      r["config"]] for r in run["gemm"]])]
    if run.get("decode"):
        out += ["", "**gemm_a8w8_blockscale at M = 1 on shapes no GEMM table has** (the "
                "heuristic's pick, as every AMD shape takes it), graph time", "", _table(
                    ["N", "K", "graph", "weights, of copy", "weights, of same-size copy",
                     "event", "config"],
                    [[r["n"], r["k"], r["graph_us"], f"{r['weight_copy_frac']:.0%}",
                      f"{r['same_copy_frac']:.0%}", r["us"], r["config"]]
                     for r in run["decode"]])]
    if run.get("overhead", {}).get("calls_us"):
        o = run["overhead"]
        again = f"; measured again at commit {o['commit']}" if o.get("commit") else ""
        out += ["", "**Host time per eager call** (T = 1; overhead: over a bare "
                f"`torch.mul(out=)` launch{again})", "", _table(
                    ["call", "us", "overhead us"],
                    [[k, v, o["overhead_us"][k]] for k, v in o["calls_us"].items()])]
    return "\n".join(out) + "\n"


def _span(values, fmt="{:.0%}") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    sep = " to " if lo < 0 else "-"   # host overheads can read below the bare launch
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}{sep}{fmt.format(hi)}"


def _peer_span(rows: list[dict], x: str) -> str:
    """", a-b x <peer>" for each optional peer timed at these rows (every shape it was)."""
    return "".join(f", {_span((r[f'vs_{k}'] for r in rows if f'vs_{k}' in r), x)} {label}"
                   for k, label in PEERS if any(f"vs_{k}" in r for r in rows))


def _compile_caveat(run: dict, section: str) -> str:
    """Runs before the torch.compile peers were compiled per shape (peer_compile "static")
    recompiled them with symbolic sizes after their first shapes, a slower graph: their ratios
    overstate ours, and the line says so."""
    src = next((r for r in run.get("sources") or [run]
                if section in r.get("sections", [section])), run)
    if src.get("peer_compile") == "static":
        return ""
    return (" (the torch.compile peers of that run were recompiled with symbolic sizes after "
            "their first shapes: those ratios overstate ours)")


def _same_span(rows: list[dict]) -> str:
    same = [r["same_copy_frac"] for r in rows if "same_copy_frac" in r]
    return f" ({_span(same)} of a same-size copy)" if same else ""


def summary(run: dict) -> str:
    """One line per family: the large-problem fraction of copy and the ratio to its peer."""
    x = "{:.2f}x"
    big = lambda rows: [r for r in rows if r["t"] >= 4096 and r["h"] >= 4096]   # noqa: E731
    runs = run.get("sources") or [dict(_meta(run), sections=[])]
    copy = lambda r: f"copy {r['copy_graph_gbs']:.0f} GB/s{_pdl_off(r)}"   # noqa: E731
    when = "; ".join(f"{', '.join(r['sections'])} {r['date']}"
                     + (f" at {r['commit']}" if r.get("commit") else "") + f" ({copy(r)})"
                     for r in runs) if len(runs) > 1 else f"{run['date']} ({copy(run)})"
    lines = [f"{run['device']}, {when}; graph time, T >= 4096 and H >= 4096 unless said:", ""]
    if run.get("quant"):
        rows = big([r for r in run["quant"] if r["g"] == 128])
        lines.append(f"- per_token_group_quant_fp8 (bf16, G 128): {_span(r['copy_frac'] for r in rows)}"
                     f" of copy{_same_span(rows)}; "
                     f"{_span((r['vs_compile'] for r in rows), x)} torch.compile"
                     + _peer_span(rows, x) + _compile_caveat(run, "quant"))
    for op in ("rmsnorm", "fused_add_rmsnorm"):
        rows = big([r for r in run.get("rmsnorm", []) if r["op"] == op])
        if rows:
            every = [r["vs_compile"] for r in run["rmsnorm"] if r["op"] == op]
            lines.append(f"- {op} (bf16): {_span(r['copy_frac'] for r in rows)} of copy; "
                         f"{_span(every, x)} torch.compile over every shape measured"
                         + _peer_span(rows, x) + _compile_caveat(run, "rmsnorm"))
    rows = big([r for r in run.get("rmsnorm_quant", []) if r["op"] == "rmsnorm_group_quant"])
    if rows:
        lines.append(f"- rmsnorm_group_quant (bf16, G 128): {_span(r['copy_frac'] for r in rows)}"
                     f" of copy{_same_span(rows)}; "
                     f"{_span((r['vs_compile'] for r in rows), x)} torch.compile"
                     + _peer_span(rows, x) + _compile_caveat(run, "rmsnorm_quant"))
    dual = [r for r in run.get("rmsnorm_quant", []) if r["op"] == "dual_rmsnorm_group_quant"]
    if dual:
        lines.append(f"- dual_rmsnorm_group_quant: one launch {_span((r['speedup'] for r in dual), x)}"
                     f" faster than two")
    gemm = run.get("gemm", [])
    for label, pred in (("M = 16-64", lambda m: 16 <= m <= 64), ("M = 128", lambda m: m == 128),
                        ("M >= 1024", lambda m: m >= 1024)):
        rows = [r for r in gemm if pred(r["m"])]
        if rows:
            lines.append(f"- gemm_a8w8_blockscale, {label}: {_span((r['vs_cublas'] for r in rows), x)}"
                         f" cuBLAS blockwise ({_span((r['tflops'] for r in rows), '{:.0f}')} "
                         f"TFLOP/s)")
    ones = [r for r in gemm if r["m"] == 1]
    if ones:
        lines.append(f"- gemm_a8w8_blockscale, M = 1: weights read at "
                     f"{_span(r['weight_copy_frac'] for r in ones)} of copy" +
                     (f", {_span(r['same_copy_frac'] for r in ones)} of a same-size copy"
                      if all("same_copy_frac" in r for r in ones) else ""))
    decode = run.get("decode", [])
    if decode:
        lines.append(f"- gemm_a8w8_blockscale, M = 1 on shapes no table has: weights read at "
                     f"{_span(r['weight_copy_frac'] for r in decode)} of copy, "
                     f"{_span(r['same_copy_frac'] for r in decode)} of a same-size copy")
    o = run.get("overhead", {}).get("overhead_us")
    if isinstance(o, dict):
        single = {k: v for k, v in o.items()
                  if not k.startswith(("torch.", "nn.", "vllm.", "aiter.")) and "+" not in k}
        lines.append(f"- host time per eager call of an op over a bare `torch.mul(out=)` "
                     f"launch: {_span(single.values(), '{:.1f}')} us; BlockFP8Linear.forward "
                     f"{o.get('nn.BlockFP8Linear.forward', float('nan')):.1f} us against "
                     f"{o.get('quant + gemm by hand', float('nan')):.1f} us for its two ops")
    return "\n".join(lines) + "\n"


def _replace(path: Path, markers: tuple[str, str], body: str) -> bool:
    text = path.read_text()
    begin, end = markers
    if begin not in text or end not in text:
        print(f"bench_report: {path} has no {begin} / {end} markers", file=sys.stderr)
        return False
    head, rest = text.split(begin, 1)
    path.write_text(f"{head}{begin}\n{body}{end}{rest.split(end, 1)[1]}")
    return True


def _copy_for(run: dict, section: str) -> float:
    """The graph copy (GB/s) of the run a section came from."""
    return next((s["copy_graph_gbs"] for s in run.get("sources", []) if section in s["sections"]),
                run["copy_graph_gbs"])


def roofline(run: dict, path: Path) -> bool:
    """Achieved bandwidth (memory-bound ops) and FLOP rate (GEMM) against the measured
    ceilings: the graph-timed copy, and the best cuBLAS rate of the run."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    bw = _copy_for(run, "quant")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    def pts(rows):
        return [(r["gbs"] * r["graph_us"] * 1e3, r["gbs"]) for r in rows]   # (bytes, GB/s)
    norm = run.get("rmsnorm", [])
    series = {"quant": pts(run.get("quant", [])),
              "rmsnorm": pts([r for r in norm if r["op"] == "rmsnorm"]),
              "fused_add_rmsnorm": pts([r for r in norm if r["op"] == "fused_add_rmsnorm"]),
              "rmsnorm_group_quant": pts([r for r in run.get("rmsnorm_quant", [])
                                          if r["op"] == "rmsnorm_group_quant"])}
    for name, pts in series.items():
        if pts:
            left.scatter([p[0] / 1e6 for p in pts], [p[1] for p in pts], label=name, s=14)
    left.axhline(bw, color="k", lw=1, ls="--", label=f"copy {bw:.0f} GB/s")
    left.set(xscale="log", xlabel="bytes moved per call (MB)", ylabel="GB/s (graph time)",
             title="memory-bound ops")
    left.legend(fontsize=7)
    gemm = run.get("gemm", [])
    if gemm:
        peak = max((r["cublas_tflops"] or 0) for r in gemm) or max(r["tflops"] for r in gemm)
        ai = [2 * r["m"] * r["n"] * r["k"] / (r["m"] * r["k"] + r["n"] * r["k"] +
                                              2 * r["m"] * r["n"]) for r in gemm]
        right.scatter(ai, [r["tflops"] for r in gemm], s=14, label="ours")
        right.scatter(ai, [r["cublas_tflops"] or float("nan") for r in gemm], s=14, marker="x",
                      label="cuBLAS blockwise")
        xs, bw = sorted(ai), _copy_for(run, "gemm")
        right.plot(xs, [min(peak, bw * x / 1e3) for x in xs], "k--", lw=1,
                   label=f"min(copy x intensity, best cuBLAS {peak:.0f} TFLOP/s)")
        right.set(xscale="log", yscale="log", xlabel="FLOP per byte (A + B + out once)",
                  ylabel="TFLOP/s (graph time)", title="FP8 block-scale GEMM")
        right.legend(fontsize=7)
    fig.suptitle(f"{run['device']}, {run['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("json", nargs="*", type=Path, help="bench JSONs (default: every one in "
                    "docs/bench/)")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--tables", type=Path, default=ROOT / "docs" / "performance.md")
    ap.add_argument("--plot", type=Path, default=RESULTS / "roofline.png",
                    help="where the roofline goes (another device's runs: another file)")
    args = ap.parse_args(argv)
    paths = args.json or sorted(RESULTS.glob("*.json"))
    if not paths:
        print(f"bench_report: no JSON in {RESULTS}", file=sys.stderr)
        return 2
    run = latest(paths)
    source = ", ".join(r["file"] for r in run["sources"])
    if not (_replace(args.tables, (BEGIN, END), tables(run, source))
            and _replace(args.readme, SUMMARY, summary(run))):
        return 2
    plotted = roofline(run, args.plot)
    print(f"bench_report: {args.tables.name} and {args.readme.name}'s summary from {source}"
          + (f", {args.plot.name}" if plotted else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
