"""The README's performance tables and the roofline plot, generated from a `make bench` JSON.

    python -m codegen.bench_report [docs/bench/<run>.json]    (default: the newest there)

Rewrites the README between its `<!-- bench:begin -->` / `<!-- bench:end -->` markers and writes
docs/bench/roofline.png (matplotlib, when installed). Needs no GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "bench"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


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


def tables(run: dict, source: str) -> str:
    out = [f"Run of {run['date']} on {run['device']} (torch {run['torch']}"
           f"{', commit ' + run['commit'] if run.get('commit') else ''}): copy "
           f"{run['copy_graph_gbs']:.0f} GB/s by graph time, {run['copy_gbs']:.0f} GB/s by "
           f"events; every \"of copy\" is against the graph copy. Times in us; \"graph\" is the "
           f"per-call time in a CUDA graph over rotating inputs, \"event\" one call with its "
           f"launch; peers are timed the same way in the same run. Raw figures: `{source}`."]
    if run.get("quant"):
        rows = [r for r in run["quant"] if r["g"] == 128]
        out += ["", "**per_token_group_quant_fp8** (bf16 in, G = 128)", "", _table(
            ["T", "H", "graph", "of copy", "event", "torch.compile graph", "x compile"],
            [[r["t"], r["h"], r["graph_us"], f"{r['copy_frac']:.0%}", r["us"],
              r["compile_graph_us"], r["vs_compile"]] for r in rows])]
    if run.get("rmsnorm"):
        out += ["", "**rmsnorm / fused_add_rmsnorm** (bf16)", "", _table(
            ["op", "T", "H", "graph", "of copy", "event", "torch.compile graph", "x compile"],
            [[r["op"], r["t"], r["h"], r["graph_us"], f"{r['copy_frac']:.0%}", r["us"],
              r["compile_graph_us"], r["vs_compile"]] for r in run["rmsnorm"]])]
    if run.get("rmsnorm_quant"):
        rgq = [r for r in run["rmsnorm_quant"] if r["op"] == "rmsnorm_group_quant"]
        dual = [r for r in run["rmsnorm_quant"] if r["op"] == "dual_rmsnorm_group_quant"]
        out += ["", "**rmsnorm_group_quant** (bf16 in, G = 128)", "", _table(
            ["T", "H", "graph", "of copy", "event", "torch.compile graph", "x compile"],
            [[r["t"], r["h"], r["graph_us"], f"{r['copy_frac']:.0%}", r["us"],
              r["compile_graph_us"], r["vs_compile"]] for r in rgq])]
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
                     "weights, of copy", "event", "config"],
                    [[r["m"], r["n"], r["k"], r["graph_us"], r["tflops"], r["cublas_tflops"],
                      r["vs_cublas"], f"{r['weight_copy_frac']:.0%}", r["us"], r["config"]]
                     for r in run["gemm"]])]
    if run.get("overhead", {}).get("calls_us"):
        o = run["overhead"]
        out += ["", "**Host time per eager call** (T = 1; overhead: over a bare "
                "`torch.mul(out=)` launch)", "", _table(
                    ["call", "us", "overhead us"],
                    [[k, v, o["overhead_us"][k]] for k, v in o["calls_us"].items()])]
    return "\n".join(out) + "\n"


def roofline(run: dict, path: Path) -> bool:
    """Achieved bandwidth (memory-bound ops) and FLOP rate (GEMM) against the measured
    ceilings: the graph-timed copy, and the best cuBLAS rate of the run."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    bw = run["copy_graph_gbs"]
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
        xs = sorted(ai)
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
    ap.add_argument("json", nargs="?", type=Path, help="a bench JSON (default: newest in "
                    "docs/bench/)")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = ap.parse_args(argv)
    path = args.json or max(RESULTS.glob("*.json"), key=lambda p: p.stat().st_mtime,
                            default=None)
    if path is None:
        print(f"bench_report: no JSON in {RESULTS}", file=sys.stderr)
        return 2
    run = json.loads(path.read_text())
    text = args.readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"bench_report: {args.readme} has no {BEGIN} / {END} markers", file=sys.stderr)
        return 2
    try:
        source = path.resolve().relative_to(ROOT)
    except ValueError:
        source = path
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    args.readme.write_text(f"{head}{BEGIN}\n{tables(run, str(source))}{END}{tail}")
    plotted = roofline(run, path.parent / "roofline.png")
    print(f"bench_report: tables from {source}" + (", roofline.png" if plotted else
                                                    " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
