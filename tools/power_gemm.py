"""GEMM configs held at load: each contender's CUDA graph (back-to-back calls over rotating
inputs, as the bench builds it) replays for --seconds while nvidia-smi samples the SM clock and
the board power every 50 ms. Prints per contender the per-call time, TFLOP/s, the medians of
clock and power over the window (its first 0.5 s left out) and the cycles a call takes. Where
the board sits at its power limit, the clock it allows says what a tile's energy costs.

    python tools/power_gemm.py [--seconds 2.5] MxNxK[,MxNxK...] CONTENDER [CONTENDER ...]

CONTENDER is kernel:BMxBN, then any of sS (stages), kK (split-K), cC (cluster), as in
tools/ab_gemm.py, or `cublas` (torch._scaled_mm with 1x128 / 128x128 scales). For example
`python tools/power_gemm.py 4096x7168x16384 tma:128x128:s5:c2 tma:256x128:s3 cublas`.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
from ab_gemm import gemm_inputs, parse_cell  # noqa: E402

SKIP_S = 0.5   # the clock settles after a contender starts


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for s in text.split(","):
        parts = s.split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"shape {s!r}: expected MxNxK")
        shapes.append(tuple(map(int, parts)))
    return shapes


def parse_contender(text: str) -> dict | None:
    """The config's keyword arguments (codegen.families.gemm.config), None for cuBLAS."""
    if text == "cublas":
        return None
    try:
        return parse_cell(f"1x1x1:{text}")[1]
    except ValueError:
        raise ValueError(f"contender {text!r}: expected cublas or "
                         "kernel:BMxBN[:sS][:kK][:cC]") from None


def parse_sample(line: str) -> tuple[float, float] | None:
    """(SM MHz, W) from a line of `nvidia-smi --query-gpu=clocks.sm,power.draw
    --format=csv,noheader,nounits`; None for a line without both."""
    try:
        clock, watts = (float(v) for v in line.split(","))
    except ValueError:
        return None
    return clock, watts


def window(samples: list[tuple[float, float, float]], t0: float, t1: float):
    """Median clock and power of the samples (time, MHz, W) taken in [t0 + SKIP_S, t1]."""
    inside = [s for s in samples if t0 + SKIP_S <= s[0] <= t1]
    if not inside:
        return float("nan"), float("nan")
    return statistics.median(s[1] for s in inside), statistics.median(s[2] for s in inside)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.5, help="how long each contender runs")
    ap.add_argument("shapes")
    ap.add_argument("contenders", nargs="+")
    args = ap.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
        contenders = {c: parse_contender(c) for c in args.contenders}
    except ValueError as e:
        ap.error(str(e))

    import torch

    from codegen.bench import _cublas_blockwise, _graph
    from codegen.families import gemm as fam
    from codegen.ops.gemm import fp8_dtype_of, gemm_with_config
    from codegen.targets import device_arch
    from codegen.tune import compile_all

    if not torch.cuda.is_available() or torch.version.hip:
        sys.exit("power_gemm: needs an NVIDIA GPU (nvidia-smi samples the clock)")
    arch = device_arch(torch.device("cuda"))
    dtype = fp8_dtype_of(arch)
    compile_all(arch, [fam.config(**kw) for kw in contenders.values() if kw])

    samples: list[tuple[float, float, float]] = []
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "50",
                            "-i", str(torch.cuda.current_device())],
                           stdout=subprocess.PIPE, text=True)

    def read():
        for line in smi.stdout:
            if (s := parse_sample(line)) is not None:
                samples.append((time.time(), *s))

    threading.Thread(target=read, daemon=True).start()
    print(f"{torch.cuda.get_device_name()}: {args.seconds} s a contender")
    print("| M x N x K | contender | us | TFLOP/s | SM MHz | W | cycles a call |\n"
          "|---|---|---|---|---|---|---|")
    try:
        for m, n, k in shapes:
            for name, kw in contenders.items():
                def make(kw=kw):
                    t = gemm_inputs(m, n, k, dtype)
                    if kw is None:
                        fn = _cublas_blockwise(*t)
                        if fn is None:
                            sys.exit("power_gemm: torch._scaled_mm takes no blockwise scales here")
                        return fn
                    cfg = fam.config(**kw)
                    return lambda: gemm_with_config(*t, cfg)

                graph, calls, held = _graph(make, m * k + n * k + 2 * m * n, 64)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                replays, t0 = 0, time.time()
                start.record()
                while time.time() - t0 < args.seconds:
                    graph.replay()
                    replays += 1
                    if replays % 4 == 0:   # keep the queue short, so the window is the run
                        torch.cuda.synchronize()
                end.record()
                end.synchronize()
                us = start.elapsed_time(end) * 1e3 / (replays * calls)
                clock, watts = window(samples, t0, time.time())
                print(f"| {m}x{n}x{k} | {name} | {us:.1f} | {2 * m * n * k / us / 1e6:.0f} | "
                      f"{clock:.0f} | {watts:.0f} | {us * clock:.0f} |", flush=True)
                del graph, held
                torch.cuda.empty_cache()
    finally:
        smi.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
