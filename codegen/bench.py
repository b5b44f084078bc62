"""Benchmarks against peers measured in the same run: `make bench` (python -m codegen.bench).

Prints one table per section and writes all figures as JSON (--json PATH). Timing: CUDA events
around each call, median of many, L2 flushed between calls (triton.testing.do_bench when present).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from . import ops, reference


def bench_us(fn, warmup_ms=25, rep_ms=100) -> float:
    """Median time of fn() in microseconds."""
    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3
    except ImportError:
        pass
    for _ in range(10):
        fn()
    times = []
    for _ in range(100):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def kernel_us(fn, n=20) -> float:
    """GPU time of the kernels fn() launches, per call, from the profiler's kernel records (no
    launch gaps, no host time): L2 flushed before each call, as bench_us does."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and "Fill" not in e.name)
    return total / n


def copy_bandwidth() -> float:
    """Device copy, GB/s counting read + write: the ceiling for memory-bound kernels."""
    x = torch.randn(8192, 7168, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    us = bench_us(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / us / 1e3


def empty_kernel_us() -> float:
    return bench_us(lambda: torch.cuda._sleep(0))


def table(title: str, cols: list[str], rows: list[list]) -> None:
    print(f"\n## {title}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in r) + " |")


def quant_section(copy_gbs: float, empty_us: float, quick: bool) -> list[dict]:
    fp8_dtype = ops.per_token_group_quant_fp8(torch.ones(1, 128, device="cuda"))[0].dtype
    fmax = 224.0 if fp8_dtype == torch.float8_e4m3fnuz else 448.0
    ts = [1, 16, 128, 1024, 8192, 16384] if not quick else [1, 16, 8192]
    hs = [1536, 4096, 7168, 16384] if not quick else [7168]
    results = []
    for g in (128, 64):
        def ref(x, g=g):
            return reference.group_quant_fp8(x, g, fp8_dtype, fmax)
        compiled = torch.compile(ref)
        for h in hs:
            for t in ts:
                x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
                torch._dynamo.mark_dynamic(x, 0) if t > 1 else None
                nbytes = t * h * 2 + t * h + t * (h // g) * 4
                # The empty kernel's time drifts by 10-20% over a run: for the cells compared
                # with it, it is measured just before and after them.
                before = empty_kernel_us() if t <= 16 else empty_us
                ours = bench_us(lambda: ops.per_token_group_quant_fp8(x, g))
                empty = (before + empty_kernel_us()) / 2 if t <= 16 else empty_us
                eager = bench_us(lambda: ref(x))
                comp = bench_us(lambda: compiled(x))
                results.append(dict(op="quant", g=g, t=t, h=h, us=ours, eager_us=eager,
                                    compile_us=comp, gbs=nbytes / ours / 1e3,
                                    copy_frac=nbytes / ours / 1e3 / copy_gbs,
                                    vs_compile=comp / ours, empty_us=empty,
                                    vs_empty=ours / empty))
    table("per_token_group_quant_fp8, bf16 in (times in us; GB/s = bytes moved / time)",
          ["G", "T", "H", "ours us", "GB/s", "of copy", "eager us", "compile us",
           "x compile", "x empty kernel"],
          [[r["g"], r["t"], r["h"], r["us"], r["gbs"], f"{r['copy_frac']:.0%}", r["eager_us"],
            r["compile_us"], r["vs_compile"], r["vs_empty"]] for r in results])
    return results


def _torch_rmsnorm(x, w, eps=1e-6):
    """The peer: RMSNorm as models write it in PyTorch (vLLM's forward_native)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _torch_add_rmsnorm(x, r, w, eps=1e-6):
    r = x + r
    return _torch_rmsnorm(r, w, eps), r


def _torch_rmsnorm_quant(x, w, fp8_dtype, fmax, g=128, eps=1e-6):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    yg = y.reshape(y.shape[0], -1, g)
    s = yg.abs().amax(-1, keepdim=True).clamp_min(1e-10) / fmax
    return (yg / s).clamp(-fmax, fmax).to(fp8_dtype).reshape(y.shape), s.squeeze(-1)


def _rmsnorm_cells(ts: list[int], hs: list[int]):
    """(op, T, H, bytes moved, ours, torch.compile peer) per cell, bf16; each cell's callables
    must be used before the next cell is drawn (its inputs replace the last one's)."""
    peer_norm, peer_add = torch.compile(_torch_rmsnorm), torch.compile(_torch_add_rmsnorm)
    for h in hs:
        w = torch.randn(h, device="cuda").to(torch.bfloat16)
        for t in ts:
            x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            r = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            if t > 1:
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(r, 0)
            yield ("rmsnorm", t, h, 2 * t * h * 2, lambda: ops.rmsnorm(x, w),
                   lambda: peer_norm(x, w))
            yield ("fused_add_rmsnorm", t, h, 4 * t * h * 2,
                   lambda: ops.fused_add_rmsnorm(x, r, w), lambda: peer_add(x, r, w))


def rmsnorm_section(copy_gbs: float, quick: bool) -> list[dict]:
    ts = [1, 16, 256, 4096, 16384] if not quick else [16, 4096]
    hs = [1536, 4096, 7168, 8192] if not quick else [7168]
    results = []
    for op, t, h, nbytes, ours, peer in _rmsnorm_cells(ts, hs):
        us, pus = bench_us(ours), bench_us(peer)
        results.append(dict(op=op, t=t, h=h, us=us, compile_us=pus, gbs=nbytes / us / 1e3,
                            copy_frac=nbytes / us / 1e3 / copy_gbs, vs_compile=pus / us))
    table("rmsnorm / fused_add_rmsnorm, bf16 (GB/s = bytes moved / time)",
          ["op", "T", "H", "ours us", "GB/s", "of copy", "compile us", "x compile"],
          [[r["op"], r["t"], r["h"], r["us"], r["gbs"], f"{r['copy_frac']:.0%}",
            r["compile_us"], r["vs_compile"]] for r in results])
    return results


def rmsnorm_kernel_section(quick: bool) -> list[dict]:
    """Small T: a few us of kernel under a few us of launch, and host stalls of the compiled peer
    blur the event times; the profiler's kernel records compare the kernels alone. Run last: a
    profiler session can slow the launches that follow it."""
    ts = [1, 16, 256] if not quick else [16]
    hs = [1536, 4096, 7168, 8192] if not quick else [7168]
    results = []
    for op, t, h, _, ours, peer in _rmsnorm_cells(ts, hs):
        us, pus = kernel_us(ours), kernel_us(peer)
        results.append(dict(op=op, t=t, h=h, kernel_us=us, compile_kernel_us=pus,
                            vs_compile=pus / us))
    table("rmsnorm / fused_add_rmsnorm at small T, bf16: kernel time (profiler, us)",
          ["op", "T", "H", "ours", "torch.compile", "x compile"],
          [[r["op"], r["t"], r["h"], r["kernel_us"], r["compile_kernel_us"], r["vs_compile"]]
           for r in results])
    return results


def rmsnorm_quant_section(copy_gbs: float) -> list[dict]:
    fp8_dtype = ops.per_token_group_quant_fp8(torch.ones(1, 128, device="cuda"))[0].dtype
    fmax = 224.0 if fp8_dtype == torch.float8_e4m3fnuz else 448.0
    results = []
    peer = torch.compile(_torch_rmsnorm_quant)
    for t, h in ((4096, 7168), (16384, 7168), (4096, 4096)):
        x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        w = torch.randn(h, device="cuda").to(torch.bfloat16)
        nbytes = t * h * 2 + t * h + t * (h // 128) * 4
        us = bench_us(lambda: ops.rmsnorm_group_quant(x, w, 1e-6, 128))
        pus = bench_us(lambda: peer(x, w, fp8_dtype, fmax))
        results.append(dict(op="rmsnorm_group_quant", t=t, h=h, us=us, compile_us=pus,
                            gbs=nbytes / us / 1e3, copy_frac=nbytes / us / 1e3 / copy_gbs,
                            vs_compile=pus / us))
    table("rmsnorm_group_quant, bf16 in, G=128",
          ["T", "H", "ours us", "GB/s", "of copy", "compile us", "x compile"],
          [[r["t"], r["h"], r["us"], r["gbs"], f"{r['copy_frac']:.0%}", r["compile_us"],
            r["vs_compile"]] for r in results])

    dual = []
    for t in (1, 16, 64, 256):
        for g in (128, 64):
            q = torch.randn(t, 1536, device="cuda").to(torch.bfloat16)
            kv = torch.randn(t, 512, device="cuda").to(torch.bfloat16)
            qw = torch.randn(1536, device="cuda").to(torch.bfloat16)
            kw = torch.randn(512, device="cuda").to(torch.bfloat16)
            one = bench_us(lambda: ops.dual_rmsnorm_group_quant(q, qw, kv, kw, 1e-6, g))

            def two():
                ops.rmsnorm_group_quant(q, qw, 1e-6, g)
                ops.rmsnorm(kv, kw)
            sep = bench_us(two)
            dual.append(dict(op="dual_rmsnorm_group_quant", t=t, g=g, us=one, separate_us=sep,
                             speedup=sep / one))
    table("dual_rmsnorm_group_quant (q 1536 + kv 512, bf16): one launch vs two",
          ["T", "G", "one launch us", "two launches us", "speedup"],
          [[r["t"], r["g"], r["us"], r["separate_us"], r["speedup"]] for r in dual])
    return results + dual


def _cublas_blockwise(a, sa, b, sb):
    """torch._scaled_mm with 1x128 / 128x128 scales (cuBLAS), in the layout it expects
    (TARGETS.md); None when this torch / device / shape does not take it."""
    kb, kr = sa.shape[1], -(-sa.shape[1] // 4) * 4
    scale_a = sa.t().contiguous().t()
    buf = torch.zeros(sb.shape[0], kr, device=a.device)
    buf[:, :kb] = sb
    scale_b = buf.t()
    fn = lambda: torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b,  # noqa: E731
                                  out_dtype=torch.bfloat16)
    try:
        fn()
        torch.cuda.synchronize()
        return fn
    except (RuntimeError, ValueError):
        return None


def gemm_section(copy_gbs: float, quick: bool) -> list[dict]:
    from .families.gemm import TUNED_SHAPES, pick
    from .targets import device_arch

    arch = device_arch(torch.device("cuda"))
    dtype = ops.gemm.fp8_dtype_of(arch)
    ms = [1, 16, 64, 128, 1024, 4096, 8192] if not quick else [1, 16, 4096]
    results = []
    for n, k in TUNED_SHAPES:
        b = torch.randn(n, k, device="cuda").to(dtype)
        sb = torch.rand(-(-n // 128), -(-k // 128), device="cuda") + 0.5
        for m in ms:
            a = torch.randn(m, k, device="cuda").to(dtype)
            sa = torch.rand(m, -(-k // 128), device="cuda") + 0.5
            ours = bench_us(lambda: ops.gemm_a8w8_blockscale(a, sa, b, sb))
            ref = ops.gemm_a8w8_blockscale(a, sa, b, sb)
            peer = _cublas_blockwise(a, sa, b, sb)
            cublas = bench_us(peer) if peer else None
            if peer:   # the peer computes the same thing: a wrong layout would show here
                got = peer().float()
                err = ((got - ref.float()).abs().mean() / ref.float().abs().mean()).item()
                assert err < 1e-2, f"cuBLAS blockwise disagrees ({err:.3g}) at {m}x{n}x{k}"
            flops = 2 * m * n * k
            cfg = pick(arch, m, n, k)
            results.append(dict(op="gemm", m=m, n=n, k=k, us=ours, tflops=flops / ours / 1e6,
                                cublas_us=cublas,
                                cublas_tflops=flops / cublas / 1e6 if cublas else None,
                                vs_cublas=cublas / ours if cublas else None,
                                weight_gbs=n * k / ours / 1e3,
                                weight_copy_frac=n * k / ours / 1e3 / copy_gbs,
                                config="{kernel} {block_m}x{block_n} sk{split_k} s{stages}"
                                .format(**cfg)))
    table("gemm_a8w8_blockscale, bf16 out (weight GB/s = N*K bytes / time)",
          ["M", "N", "K", "ours us", "TFLOP/s", "cuBLAS TFLOP/s", "x cuBLAS", "weight GB/s",
           "of copy", "config"],
          [[r["m"], r["n"], r["k"], r["us"], r["tflops"], r["cublas_tflops"] or "n/a",
            r["vs_cublas"] or "n/a", r["weight_gbs"], f"{r['weight_copy_frac']:.0%}", r["config"]]
           for r in results])
    return results


def host_us(fn, n=2000) -> float:
    """Host wall time per call of fn, the GPU left to run behind it."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def host_overhead() -> dict:
    """Wall time per call with the GPU kept busy elsewhere: our op vs a bare launch."""
    x = torch.randn(1, 1536, device="cuda").to(torch.bfloat16)
    bare = min(host_us(lambda: torch.cuda._sleep(0)) for _ in range(3))
    ours = min(host_us(lambda: ops.per_token_group_quant_fp8(x)) for _ in range(3))
    r = dict(bare_launch_us=bare, op_call_us=ours, overhead_us=ours - bare)
    table("host overhead per call (T=1, H=1536)", ["bare launch us", "op call us", "overhead us"],
          [[bare, ours, ours - bare]])
    return r


JIT_SNIPPET = """
import time, torch
t0 = time.perf_counter()
from codegen import ops
x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t1 = time.perf_counter()
ops.per_token_group_quant_fp8(x, 64, scale_layout="col", ue8m0=True)
torch.cuda.synchronize()
t2 = time.perf_counter()
print(t2 - t1)
"""


def jit_section() -> dict:
    """Cold build of one module, then first call in a fresh process with the cache warm."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, CODEGEN_CACHE_DIR=d, CODEGEN_AOT_DIR=d)
        run = lambda: float(subprocess.run([sys.executable, "-c", JIT_SNIPPET], env=env,
                                           check=True, capture_output=True, text=True).stdout)
        cold, warm = run(), run()
    r = dict(cold_first_call_s=cold, warm_first_call_ms=warm * 1e3)
    table("JIT (one quant module)", ["cold first call s (build + load)", "warm-cache first call ms"],
          [[cold, warm * 1e3]])
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--json", help="write all figures here")
    ap.add_argument("--sections",
                    default="jit,overhead,quant,rmsnorm,rmsnorm_quant,gemm,rmsnorm_kernels")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench: no GPU visible; nothing to measure", file=sys.stderr)
        return 1
    torch._dynamo.config.cache_size_limit = 64
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d")}
    out["copy_gbs"] = copy_bandwidth()
    out["empty_kernel_us"] = empty_kernel_us()
    print(f"device {out['device']}, torch {out['torch']}: copy {out['copy_gbs']:.0f} GB/s, "
          f"empty kernel {out['empty_kernel_us']:.2f} us")
    sections = args.sections.split(",")
    if "jit" in sections:
        out["jit"] = jit_section()
    if "overhead" in sections:
        out["overhead"] = host_overhead()
    if "quant" in sections:
        out["quant"] = quant_section(out["copy_gbs"], out["empty_kernel_us"], args.quick)
    if "rmsnorm" in sections:
        out["rmsnorm"] = rmsnorm_section(out["copy_gbs"], args.quick)
    if "rmsnorm_quant" in sections:
        out["rmsnorm_quant"] = rmsnorm_quant_section(out["copy_gbs"])
    if "gemm" in sections:
        out["gemm"] = gemm_section(out["copy_gbs"], args.quick)
    if "rmsnorm_kernels" in sections:
        out["rmsnorm_kernels"] = rmsnorm_kernel_section(args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
