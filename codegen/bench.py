"""Benchmarks against peers measured in the same run: `make bench` (python -m codegen.bench).

Prints one table per section and writes all figures as JSON (--json PATH). Two timings per cell:
- graph: the per-call time inside a CUDA graph of many back-to-back calls over rotating input
  sets larger than 2x the last cache (L2, or AMD's Infinity Cache where a part has one), what a
  serving engine's captured step sees (no launch cost, cold inputs, outputs written to buffers
  the call before did not write); the main figure, against the copy timed the same way;
- event: CUDA events around each call, median of many, L2 flushed between calls
  (triton.testing.do_bench when present): launch cost included.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from . import ops, peers, reference
from .bench_report import SECTIONS
from .ops import _fast
from .targets import TARGETS, device_arch


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


def cache_bytes() -> int:
    """The largest cache in front of this device's memory: the L2 torch reports, or the
    target's Infinity Cache where it is larger (MI300X: 256 MiB against 4 MiB of L2 reported)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    target = TARGETS.get(device_arch(torch.device("cuda")))
    return max(props.L2_cache_size, target.cache_bytes if target else 0)


def sets_for(nbytes: int, cache: int) -> int:
    """Input sets of nbytes each whose rotation exceeds 2x a cache of that size (4096 at most:
    calls of a few KB then share a warm cache, as in a decode step)."""
    return max(2, min(4096, -(-2 * cache // max(nbytes, 1)) + 1))


def input_sets(nbytes: int) -> int:
    """How many input sets of nbytes each graph_us rotates through: enough to exceed 2x the
    device's last cache."""
    return sets_for(nbytes, cache_bytes())


def _graph(make, nbytes: int, min_calls: int):
    """(graph, calls per replay, what the graph reads and writes: keep it while the graph runs).
    make() returns one call bound to fresh inputs (nbytes read and written per call); enough are
    made that their inputs exceed 2x the last cache (input_sets), and the graph runs them in turn
    at least min_calls times. The outputs rotate too: call i's result is held until call i runs
    again, so no call writes into a buffer the call before it wrote (which would still be in the
    cache, its first write never paid to memory: the copy ceiling writes cold buffers)."""
    calls = [make() for _ in range(input_sets(nbytes))]
    for c in calls:               # outside the capture: builds, loads, compiles, allocations
        c()
    torch.cuda.synchronize()
    reps = -(-min_calls // len(calls))
    held = [None] * len(calls)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            for i, c in enumerate(calls):
                held[i] = c()
    graph.replay()
    torch.cuda.synchronize()
    return graph, reps * len(calls), (calls, held)


def graphs_us(makes: list, nbytes: int, min_calls: int = 64) -> list[float]:
    """Per-call time (us) of each make's calls in a CUDA graph of its own (see _graph), the
    graphs replayed in turn, in alternating order, so that the clock and power drift of a run
    falls on every contender of a cell alike: the median of 7 replays each."""
    graphs = [_graph(make, nbytes, min_calls) for make in makes]
    times = [[] for _ in graphs]
    for r in range(7):
        for i in (range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))):
            graph, n, _ = graphs[i]
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times[i].append(a.elapsed_time(b) * 1e3 / n)
    return [statistics.median(t) for t in times]


def graph_us(make, nbytes: int, min_calls: int = 64) -> float:
    """Per-call time (us) in a CUDA graph of back-to-back calls over rotating inputs."""
    return graphs_us([make], nbytes, min_calls)[0]


def cell_us(makes: list, nbytes: int) -> list[tuple[float, float]]:
    """(graph, event) times of each contender of one cell: graphs in turn, then events."""
    return [(g, bench_us(make())) for g, make in zip(graphs_us(makes, nbytes), makes)]


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


def copy_bandwidth_graph() -> float:
    """The same copy, timed as graph_us times the kernels: the ceiling for the graph figures."""
    def make():
        x = torch.randn(8192, 7168, device="cuda").to(torch.bfloat16)
        y = torch.empty_like(x)
        return lambda: y.copy_(x)
    nbytes = 2 * 8192 * 7168 * 2
    return nbytes / graph_us(make, nbytes) / 1e3


def same_size_copy_us(nbytes: int) -> float:
    """Graph time of a device copy moving nbytes (half read, half written): what the memory
    system gives a problem of that size, its launch ramp and tail included."""
    half = nbytes // 2

    def make():
        src = torch.empty(half, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)
    return graph_us(make, nbytes)


def _same_copy(r: dict, nbytes: int) -> None:
    """Adds the time of a copy moving nbytes and our share of it."""
    r["same_copy_graph_us"] = same_size_copy_us(nbytes)
    r["same_copy_frac"] = r["same_copy_graph_us"] / r["graph_us"]


def _large(t: int, h: int) -> bool:
    """The cells the memory-bound bars name (T >= 4096, H >= 4096)."""
    return t >= 4096 and h >= 4096


def empty_kernel_us() -> float:
    return bench_us(lambda: torch.cuda._sleep(0))


def table(title: str, cols: list[str], rows: list[list]) -> None:
    print(f"\n## {title}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in r) + " |")


def _bf16(t: int, h: int) -> torch.Tensor:
    """A fresh bf16 input; the compiled peers take static shapes (one compile per shape)."""
    return torch.randn(t, h, device="cuda").to(torch.bfloat16)


def peer_compile(fn, backend="inductor"):
    """fn compiled as the torch.compile peer: one graph per shape, each specialized to it.
    torch.compile's default recompiles a function called at a second shape with symbolic
    sizes, and every later cell then ran that slower general graph."""
    return torch.compile(fn, dynamic=False, backend=backend)


def quant_section(copy: dict, empty_us: float, quick: bool) -> list[dict]:
    fp8_dtype = ops.per_token_group_quant_fp8(torch.ones(1, 128, device="cuda"))[0].dtype
    fmax = 224.0 if fp8_dtype == torch.float8_e4m3fnuz else 448.0
    ts = [1, 16, 128, 1024, 4096, 8192, 16384] if not quick else [1, 16, 8192]
    hs = [1536, 4096, 7168, 16384] if not quick else [7168]
    vllm = peers.vllm_quant()
    results = []
    for g in (128, 64):
        def ref(x, g=g):
            return reference.group_quant_fp8(x, g, fp8_dtype, fmax)
        compiled = peer_compile(ref)
        for h in hs:
            for t in ts:
                nbytes = t * h * 2 + t * h + t * (h // g) * 4
                makes = [lambda: (lambda x=_bf16(t, h): ops.per_token_group_quant_fp8(x, g)),
                         lambda: (lambda x=_bf16(t, h): compiled(x))]
                if vllm is not None:
                    makes.append(lambda: (lambda x=_bf16(t, h): vllm(x, g, fp8_dtype, fmax)))
                times = cell_us(makes, nbytes)
                (gus, us), (gcomp, comp) = times[:2]
                r = dict(op="quant", g=g, t=t, h=h, graph_us=gus, us=us,
                         compile_graph_us=gcomp, compile_us=comp, gbs=nbytes / gus / 1e3,
                         copy_frac=nbytes / gus / 1e3 / copy["graph"], vs_compile=gcomp / gus,
                         empty_us=empty_us)
                if g == 128 and _large(t, h):
                    _same_copy(r, nbytes)
                if vllm is not None:
                    r.update(_peer("vllm", times[2], gus, us))
                results.append(r)
    table("per_token_group_quant_fp8, bf16 in (us; GB/s = bytes moved / graph time)",
          ["G", "T", "H", "graph us", "GB/s", "of copy", "event us", "compile graph us",
           "x compile", "vLLM Triton graph us", "x vLLM"],
          [[r["g"], r["t"], r["h"], r["graph_us"], r["gbs"], f"{r['copy_frac']:.0%}", r["us"],
            r["compile_graph_us"], r["vs_compile"], r.get("vllm_graph_us", "-"),
            r.get("vs_vllm", "-")] for r in results])
    return results


def _peer(name: str, times: tuple[float, float], graph_us: float, us: float) -> dict:
    """A peer's (graph, event) times and our speedup over it, as a result row's fields."""
    return {f"{name}_graph_us": times[0], f"{name}_us": times[1],
            f"vs_{name}": times[0] / graph_us, f"vs_{name}_event": times[1] / us}


def _torch_rmsnorm(x, w, eps=1e-6):
    """The peer: RMSNorm as models write it in PyTorch (vLLM's forward_native)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _torch_add_rmsnorm(x, r, w, eps=1e-6):
    r = x + r
    return _torch_rmsnorm(r, w, eps), r


def _torch_add_rmsnorm_inplace(x, r, w, eps=1e-6):
    """The same with the residual updated in place, as ours and vLLM's op write it."""
    r.add_(x)
    return _torch_rmsnorm(r, w, eps)


def _torch_rmsnorm_quant(x, w, fp8_dtype, fmax, g=128, eps=1e-6):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    yg = y.reshape(y.shape[0], -1, g)
    s = yg.abs().amax(-1, keepdim=True).clamp_min(1e-10) / fmax
    return (yg / s).clamp(-fmax, fmax).to(fp8_dtype).reshape(y.shape), s.squeeze(-1)


def _rmsnorm_cells(ts: list[int], hs: list[int]):
    """(op, T, H, bytes moved, make ours, make torch.compile peer, make AITER peer or None,
    make in-place torch.compile peer or None) per cell, bf16: each make() returns one call on
    fresh inputs. The functional peer returns its new residual in a new buffer; the in-place one
    writes where it read, as ours must."""
    peer_norm, peer_add = peer_compile(_torch_rmsnorm), peer_compile(_torch_add_rmsnorm)
    peer_add_inplace = peer_compile(_torch_add_rmsnorm_inplace)
    ait = peers.aiter()
    for h in hs:
        w = torch.randn(h, device="cuda").to(torch.bfloat16)
        for t in ts:
            yield ("rmsnorm", t, h, 2 * t * h * 2,
                   lambda t=t: (lambda x=_bf16(t, h): ops.rmsnorm(x, w)),
                   lambda t=t: (lambda x=_bf16(t, h): peer_norm(x, w)),
                   ait and (lambda t=t: (lambda x=_bf16(t, h): ait.rmsnorm(x, w))), None)
            yield ("fused_add_rmsnorm", t, h, 4 * t * h * 2,
                   lambda t=t: (lambda x=_bf16(t, h), r=_bf16(t, h): ops.fused_add_rmsnorm(
                       x, r, w)),
                   lambda t=t: (lambda x=_bf16(t, h), r=_bf16(t, h): peer_add(
                       x, r, w)),
                   ait and (lambda t=t: (lambda x=_bf16(t, h), r=_bf16(t, h):
                                         ait.fused_add_rmsnorm(x, r, w))),
                   lambda t=t: (lambda x=_bf16(t, h), r=_bf16(t, h): peer_add_inplace(
                       x, r, w)))
            if t >= 4096:   # the sum into a tensor apart (AITER's rmsnorm2d_fwd_with_add)
                yield ("fused_add_rmsnorm, residual_out", t, h, 4 * t * h * 2,
                       lambda t=t: (lambda x=_bf16(t, h), r=_bf16(t, h), o=_bf16(t, h):
                                    ops.fused_add_rmsnorm(x, r, w, residual_out=o)),
                       lambda t=t: (lambda x=_bf16(t, h), r=_bf16(t, h): peer_add(x, r, w)),
                       None, None)


def rmsnorm_section(copy: dict, quick: bool) -> list[dict]:
    ts = [1, 16, 256, 4096, 16384] if not quick else [16, 4096]
    hs = [1536, 4096, 7168, 8192] if not quick else [7168]
    results = []
    for op, t, h, nbytes, ours, peer, ait, inplace in _rmsnorm_cells(ts, hs):
        makes = [ours, peer] + [m for m in (ait, inplace) if m is not None]
        times = cell_us(makes, nbytes)
        (gus, us), (gpus, pus), rest = times[0], times[1], iter(times[2:])
        r = dict(op=op, t=t, h=h, graph_us=gus, us=us, compile_graph_us=gpus, compile_us=pus,
                 gbs=nbytes / gus / 1e3, copy_frac=nbytes / gus / 1e3 / copy["graph"],
                 vs_compile=gpus / gus, vs_compile_event=pus / us)
        if ait is not None:
            r.update(_peer("aiter", next(rest), gus, us))
        if inplace is not None:
            r.update(_peer("compile_inplace", next(rest), gus, us))
        results.append(r)
    table("rmsnorm / fused_add_rmsnorm, bf16 (us; GB/s = bytes moved / graph time)",
          ["op", "T", "H", "graph us", "GB/s", "of copy", "compile graph us", "x compile",
           "event us", "compile event us", "AITER graph us", "x AITER"],
          [[r["op"], r["t"], r["h"], r["graph_us"], r["gbs"], f"{r['copy_frac']:.0%}",
            r["compile_graph_us"], r["vs_compile"], r["us"], r["compile_us"],
            r.get("aiter_graph_us", "-"), r.get("vs_aiter", "-")] for r in results])
    return results


def rmsnorm_kernel_section(quick: bool) -> list[dict]:
    """Small T: a few us of kernel under a few us of launch, and host stalls of the compiled peer
    blur the event times; the profiler's kernel records compare the kernels alone. Run last: a
    profiler session can slow the launches that follow it."""
    ts = [1, 16, 256] if not quick else [16]
    hs = [1536, 4096, 7168, 8192] if not quick else [7168]
    results = []
    for op, t, h, _, ours, peer, _, _ in _rmsnorm_cells(ts, hs):
        us, pus = kernel_us(ours()), kernel_us(peer())
        results.append(dict(op=op, t=t, h=h, kernel_us=us, compile_kernel_us=pus,
                            vs_compile=pus / us))
    table("rmsnorm / fused_add_rmsnorm at small T, bf16: kernel time (profiler, us)",
          ["op", "T", "H", "ours", "torch.compile", "x compile"],
          [[r["op"], r["t"], r["h"], r["kernel_us"], r["compile_kernel_us"], r["vs_compile"]]
           for r in results])
    return results


def rmsnorm_quant_section(copy: dict) -> list[dict]:
    fp8_dtype = ops.per_token_group_quant_fp8(torch.ones(1, 128, device="cuda"))[0].dtype
    fmax = 224.0 if fp8_dtype == torch.float8_e4m3fnuz else 448.0
    results = []
    peer = peer_compile(_torch_rmsnorm_quant)
    ait = peers.aiter()
    for t, h in ((16, 7168), (256, 7168), (4096, 4096), (4096, 7168), (16384, 7168)):
        w = torch.randn(h, device="cuda").to(torch.bfloat16)
        nbytes = t * h * 2 + t * h + t * (h // 128) * 4
        makes = [lambda: (lambda x=_bf16(t, h): ops.rmsnorm_group_quant(x, w, 1e-6, 128)),
                 lambda: (lambda x=_bf16(t, h): peer(x, w, fp8_dtype, fmax))]
        if ait is not None:
            makes.append(lambda: (lambda x=_bf16(t, h): ait.rmsnorm_group_quant(x, w, fp8_dtype)))
        times = cell_us(makes, nbytes)
        (gus, us), (gpus, pus) = times[:2]
        r = dict(op="rmsnorm_group_quant", t=t, h=h, graph_us=gus, us=us,
                 compile_graph_us=gpus, compile_us=pus, gbs=nbytes / gus / 1e3,
                 copy_frac=nbytes / gus / 1e3 / copy["graph"], vs_compile=gpus / gus)
        if _large(t, h):
            _same_copy(r, nbytes)
        if ait is not None:
            r.update(_peer("aiter", times[2], gus, us))
        results.append(r)
    table("rmsnorm_group_quant, bf16 in, G=128 (us; GB/s = bytes moved / graph time)",
          ["T", "H", "graph us", "GB/s", "of copy", "compile graph us", "x compile",
           "event us", "AITER graph us", "x AITER"],
          [[r["t"], r["h"], r["graph_us"], r["gbs"], f"{r['copy_frac']:.0%}",
            r["compile_graph_us"], r["vs_compile"], r["us"], r.get("aiter_graph_us", "-"),
            r.get("vs_aiter", "-")] for r in results])

    dual = []
    for t in (1, 16, 64, 256):
        for g in (128, 64):
            qw = torch.randn(1536, device="cuda").to(torch.bfloat16)
            kw = torch.randn(512, device="cuda").to(torch.bfloat16)
            nbytes = t * (1536 * 3 + 512 * 4) + t * (1536 // g) * 4

            def one():
                q, kv = _bf16(t, 1536), _bf16(t, 512)
                return lambda: ops.dual_rmsnorm_group_quant(q, qw, kv, kw, 1e-6, g)

            def two():
                q, kv = _bf16(t, 1536), _bf16(t, 512)

                def call():     # its outputs kept, as the one launch's are (no reuse in L2)
                    return ops.rmsnorm_group_quant(q, qw, 1e-6, g), ops.rmsnorm(kv, kw)
                return call
            (gone, eone), (gsep, esep) = cell_us([one, two], nbytes)
            dual.append(dict(op="dual_rmsnorm_group_quant", t=t, g=g, graph_us=gone, us=eone,
                             separate_graph_us=gsep, separate_us=esep, speedup=gsep / gone,
                             speedup_event=esep / eone))
    table("dual_rmsnorm_group_quant (q 1536 + kv 512, bf16): one launch vs two (us)",
          ["T", "G", "one, graph", "two, graph", "speedup", "one, event", "two, event",
           "speedup (event)"],
          [[r["t"], r["g"], r["graph_us"], r["separate_graph_us"], r["speedup"], r["us"],
            r["separate_us"], r["speedup_event"]] for r in dual])
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


def a_scales_as(sa: torch.Tensor, layout: str) -> torch.Tensor:
    """sa [M, KB] as the GEMM is given it: "row" (contiguous) or "col_tma" (column-major, each
    column padded to a multiple of 4 rows), the layouts the quant ops write."""
    if layout == "row":
        return sa
    if layout != "col_tma":
        raise ValueError(f"layout: {layout!r} is not 'row' or 'col_tma'")
    m, kb = sa.shape
    store = sa.new_zeros(kb, -(-m // 4) * 4)
    store[:, :m] = sa.t()
    return store[:, :m].t()


def _gemm_cell(m: int, n: int, k: int, copy: dict, scales: str = "row") -> dict:
    """One GEMM cell: ours (the config dispatch picks on this device) against cuBLAS blockwise
    where it has a kernel; at M = 1 the weight read against a copy of as many bytes."""
    from .families.gemm import pick
    from .ops._common import multiprocessors

    arch = device_arch(torch.device("cuda"))
    dtype = ops.gemm.fp8_dtype_of(arch)

    def inputs():
        a = torch.randn(m, k, device="cuda").to(dtype)
        sa = a_scales_as(torch.rand(m, -(-k // 128), device="cuda") + 0.5, scales)
        b = torch.randn(n, k, device="cuda").to(dtype)
        sb = torch.rand(-(-n // 128), -(-k // 128), device="cuda") + 0.5
        return a, sa, b, sb
    a, sa, b, sb = inputs()
    ref = ops.gemm_a8w8_blockscale(a, sa, b, sb)
    peer = _cublas_blockwise(a, sa, b, sb)
    if peer:   # the peer computes the same thing: a wrong layout would show here
        got = peer().float()
        err = ((got - ref.float()).abs().mean() / ref.float().abs().mean()).item()
        assert err < 1e-2, f"cuBLAS blockwise disagrees ({err:.3g}) at {m}x{n}x{k}"
    nbytes = m * k + n * k + m * n * 2          # each set's A, B (weights) and out
    makes = [lambda: (lambda t=inputs(): ops.gemm_a8w8_blockscale(*t))]
    if peer:
        makes.append(lambda: _cublas_blockwise(*inputs()))
    times = cell_us(makes, nbytes)
    (gus, us), (gcub, cub) = times[0], times[1] if peer else (None, None)
    flops = 2 * m * n * k
    cfg = pick(arch, m, n, k, multiprocessors(a))   # as dispatch picks it
    row = dict(op="gemm", m=m, n=n, k=k, a_scales=scales, graph_us=gus, us=us,
               tflops=flops / gus / 1e6, cublas_graph_us=gcub, cublas_us=cub,
               cublas_tflops=flops / gcub / 1e6 if gcub else None,
               vs_cublas=gcub / gus if gcub else None,
               vs_cublas_event=cub / us if cub else None,
               weight_gbs=n * k / gus / 1e3, weight_copy_frac=n * k / gus / 1e3 / copy["graph"],
               config="{kernel} {block_m}x{block_n} sk{split_k} s{stages}".format(**cfg)
               + (f" c{cfg['cluster']}" if cfg["cluster"] > 1 else "")
               + (" pf" if cfg["l2_first_pass"] else ""))
    if m == 1:   # decode: the weight read against a copy moving as many bytes
        _same_copy(row, n * k)
    return row


def gemm_section(copy: dict, quick: bool, only_ms: list[int] | None = None,
                 scales: str = "row") -> list[dict]:
    from .families.gemm import TUNED_SHAPES

    ms = [1, 16, 64, 128, 1024, 2048, 4096, 8192] if not quick else [1, 16, 4096]
    if only_ms:
        ms = sorted(only_ms)
    # M ascending in the outer loop: a decode cell timed right after an 8192-row one would run
    # at the lower SM clock that the board's power limit left behind (its peers too)
    results = [_gemm_cell(m, n, k, copy, scales) for m in ms for n, k in TUNED_SHAPES]
    results.sort(key=lambda r: (TUNED_SHAPES.index((r["n"], r["k"])), r["m"]))
    table(f"gemm_a8w8_blockscale, bf16 out, {scales} A scales (graph time; weight GB/s = N*K "
          "bytes / time)",
          ["M", "N", "K", "graph us", "TFLOP/s", "cuBLAS TFLOP/s", "x cuBLAS", "weight GB/s",
           "of copy", "of same-size copy", "event us", "x cuBLAS (event)", "config"],
          [[r["m"], r["n"], r["k"], r["graph_us"], r["tflops"], r["cublas_tflops"] or "n/a",
            r["vs_cublas"] or "n/a", r["weight_gbs"], f"{r['weight_copy_frac']:.0%}",
            f"{r['same_copy_frac']:.0%}" if "same_copy_frac" in r else "-", r["us"],
            r["vs_cublas_event"] or "n/a", r["config"]] for r in results])
    return results


# Decode (M = 1) at layers no GEMM table has, N x K: Llama 3.1 8B's fused QKV, O, gate + up
# and down; 70B's QKV, O and down; Qwen3 32B's fused QKV and down. Every AMD shape takes the
# heuristic too, so these keep it measured.
DECODE_SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192),
                 (8192, 8192), (8192, 28672), (10240, 5120), (5120, 25600))


def decode_section(copy: dict, quick: bool) -> list[dict]:
    shapes = DECODE_SHAPES[:3] if quick else DECODE_SHAPES
    results = [_gemm_cell(1, n, k, copy) for n, k in shapes]
    table("gemm_a8w8_blockscale at M = 1, shapes no table has (the heuristic's pick; graph "
          "time; weight GB/s = N*K bytes / time)",
          ["N", "K", "graph us", "weight GB/s", "of copy", "of same-size copy", "event us",
           "config"],
          [[r["n"], r["k"], r["graph_us"], r["weight_gbs"], f"{r['weight_copy_frac']:.0%}",
            f"{r['same_copy_frac']:.0%}", r["us"], r["config"]] for r in results])
    return results


def host_us(cases: dict, n=400, rounds=15) -> dict:
    """Host wall time per call of each fn in cases, the GPU left to run behind it: the median
    over rounds of a loop of n calls. The cases take turns within each round, so that a slow
    spell of the host falls on all of them alike."""
    loops = {name: [] for name in cases}
    for fn in cases.values():
        fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            loops[name].append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(v) for name, v in loops.items()}


def host_overhead() -> dict:
    """Wall time per eager call at T = 1 with the GPU left to run behind (the host is the
    limit): every op, the modules and the vLLM and AITER entry points, against bare torch
    launches."""
    from . import aiter, vllm
    from . import nn as cnn

    bf = torch.bfloat16
    x = torch.randn(1, 1536, device="cuda", dtype=bf)
    w = torch.randn(1536, device="cuda", dtype=bf)
    kv, kw = torch.randn(1, 512, device="cuda", dtype=bf), torch.randn(512, device="cuda", dtype=bf)
    res, y, res_out = torch.randn_like(x), torch.empty_like(x), torch.empty_like(x)
    lin = cnn.BlockFP8Linear.from_linear(torch.nn.Linear(7168, 2112, bias=False, device="cuda"))
    a = torch.randn(1, 7168, device="cuda", dtype=bf)
    qa, sa = ops.per_token_group_quant_fp8(a)
    cases = {
        "torch.mul(out=)": lambda: torch.mul(x, x, out=y),
        "torch.mul": lambda: torch.mul(x, x),
        "per_token_group_quant_fp8": lambda: ops.per_token_group_quant_fp8(x),
        "rmsnorm": lambda: ops.rmsnorm(x, w),
        "fused_add_rmsnorm": lambda: ops.fused_add_rmsnorm(x, res, w),
        "rmsnorm_group_quant": lambda: ops.rmsnorm_group_quant(x, w),
        "dual_rmsnorm_group_quant": lambda: ops.dual_rmsnorm_group_quant(x, w, kv, kw),
        "gemm_a8w8_blockscale 1x2112x7168": lambda: ops.gemm_a8w8_blockscale(
            qa, sa, lin.weight, lin.weight_scale_inv),
        "quant + gemm by hand": lambda: ops.gemm_a8w8_blockscale(
            *ops.per_token_group_quant_fp8(a), lin.weight, lin.weight_scale_inv),
        "nn.BlockFP8Linear.forward": lambda: lin(a),
        "vllm.rms_norm": lambda: vllm.rms_norm(y, x, w, 1e-6),
        "vllm.per_token_group_quant_fp8": lambda: vllm.per_token_group_quant_fp8(x, 128),
        "aiter.rms_norm": lambda: aiter.rms_norm(x, w, 1e-6),
        "aiter.rmsnorm2d_fwd_with_add": lambda: aiter.rmsnorm2d_fwd_with_add(
            y, x, res, res_out, w, 1e-6),
        "aiter.per_group_quant_hip": lambda: aiter.per_group_quant_hip(x, quant_dtype=qa.dtype),
        "aiter.gemm_a8w8_blockscale 1x2112x7168": lambda: aiter.gemm_a8w8_blockscale(
            qa, lin.weight, sa, lin.weight_scale_inv),
    }
    return overhead_figures(host_us(cases))


def overhead_figures(us: dict) -> dict:
    """Each call's host time past a bare torch launch (torch.mul(out=), one of the cases)."""
    bare = us["torch.mul(out=)"]
    table("host time per eager call, T=1 (us; overhead = call - torch.mul(out=))",
          ["call", "us", "overhead us"], [[k, v, v - bare] for k, v in us.items()])
    return dict(calls_us=us, bare_launch_us=bare,
                overhead_us={k: v - bare for k, v in us.items()})


JIT_SNIPPET = """
import time, torch
from codegen import ops
from codegen.ops import _fast
x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t1 = time.perf_counter()
ops.per_token_group_quant_fp8(x, 64, scale_layout="col", ue8m0=True)
torch.cuda.synchronize()
t2 = time.perf_counter()
_fast.module(wait=True)
print(t2 - t1, time.perf_counter() - t1)
"""


def jit_section() -> dict:
    """Cold build of one module, then first call in a fresh process with the cache warm; each
    also says when the eager fast path (built in the background) was ready."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, CODEGEN_CACHE_DIR=d, CODEGEN_AOT_DIR=d)
        run = lambda: [float(v) for v in subprocess.run(
            [sys.executable, "-c", JIT_SNIPPET], env=env, check=True, capture_output=True,
            text=True).stdout.splitlines()[-1].split()]
        (cold, cold_ready), (warm, _) = run(), run()
    r = dict(cold_first_call_s=cold, cold_fast_path_ready_s=cold_ready,
             warm_first_call_ms=warm * 1e3)
    table("JIT (one quant module)", ["cold first call s (build + load)",
                                     "fast path ready s (background build)",
                                     "warm-cache first call ms"], [[cold, cold_ready, warm * 1e3]])
    return r


CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds codegen/


def source_commit() -> str | None:
    """The checkout's commit (with "+changes" where tracked files differ from it), if a git one."""
    try:
        head = subprocess.run(["git", "-C", CHECKOUT, "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", CHECKOUT, "diff", "--quiet", "HEAD", "--"]).returncode
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if dirty else "")


SOURCE_DIRS = ("codegen", "templates")


def source_digest(root: str | None = None) -> str:
    """A hash of the sources a run measured (every file under codegen/ and templates/ but
    bytecode): it names the tree where git cannot, as in a copy whose git metadata lags its files.
    `python -m codegen.bench --digest` prints it for a checkout."""
    root = root or CHECKOUT
    h = hashlib.sha256()
    for top in SOURCE_DIRS:
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    data = f.read()
                h.update(f"{os.path.relpath(path, root)}\0{len(data)}\0".encode() + data)
    return h.hexdigest()[:12]


def card_name(device: str) -> str:
    """The card's model from torch's device name: its first word with a digit ("NVIDIA H100
    80GB HBM3" -> h100, "AMD Instinct MI300X" -> mi300x), else the last word."""
    words = device.split() or ["gpu"]
    return next((w for w in words if any(c.isdigit() for c in w)), words[-1]).lower()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m codegen.bench")
    ap.add_argument("--digest", action="store_true",
                    help="print the sources' hash (a run's `sources_digest`) and exit")
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--json", help="write all figures here (a folder: <card>-<date>.json in it)")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated, of {','.join(SECTIONS)}")
    ap.add_argument("--gemm-ms", help="the GEMM section at these M only (comma-separated)")
    ap.add_argument("--gemm-scales", choices=("row", "col_tma"), default="row",
                    help="the layout of A's scales the GEMM section gives our kernel")
    args = ap.parse_args(argv)
    if args.digest:
        print(source_digest())
        return 0
    if unknown := set(args.sections.split(",")) - set(SECTIONS):
        ap.error(f"--sections: unknown {', '.join(sorted(unknown))}; expected some of "
                 f"{','.join(SECTIONS)}")
    try:
        gemm_ms = args.gemm_ms and [int(m) for m in args.gemm_ms.split(",")]
    except ValueError:
        ap.error(f"--gemm-ms: {args.gemm_ms!r}; expected integers, comma-separated")
    if not torch.cuda.is_available():
        print("bench: no GPU visible; nothing to measure", file=sys.stderr)
        return 1
    torch._dynamo.config.cache_size_limit = 256     # one compiled graph per peer and shape
    torch._dynamo.config.accumulated_cache_size_limit = 4096
    _fast.module(wait=True)     # the eager calls timed are the C++ path's where it builds
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "time": time.strftime("%H:%M:%S"),
           "rotated_past_bytes": 2 * cache_bytes(),   # what each cell's inputs exceed
           "peer_compile": "static",    # torch.compile peers: one specialized graph per shape
           # our kernels' launches overlap under programmatic dependent launch unless CODEGEN_PDL=0
           "pdl": not os.environ.get("CODEGEN_PDL", "").startswith("0")}
    if args.json and (args.json.endswith("/") or os.path.isdir(args.json)):
        os.makedirs(args.json, exist_ok=True)
        args.json = os.path.join(args.json, f"{card_name(out['device'])}-{out['date']}.json")
    if commit := source_commit():
        out["commit"] = commit
    out["sources_digest"] = source_digest()
    out["copy_gbs"] = copy_bandwidth()
    out["copy_graph_gbs"] = copy_bandwidth_graph()
    out["empty_kernel_us"] = empty_kernel_us()
    copy = {"graph": out["copy_graph_gbs"], "event": out["copy_gbs"]}
    print(f"device {out['device']}, torch {out['torch']}: copy {out['copy_graph_gbs']:.0f} GB/s "
          f"(graph), {out['copy_gbs']:.0f} GB/s (events), empty kernel "
          f"{out['empty_kernel_us']:.2f} us")
    sections = args.sections.split(",")
    runs = {"jit": jit_section, "overhead": host_overhead,
            "quant": lambda: quant_section(copy, out["empty_kernel_us"], args.quick),
            "rmsnorm": lambda: rmsnorm_section(copy, args.quick),
            "rmsnorm_quant": lambda: rmsnorm_quant_section(copy),
            "gemm": lambda: gemm_section(copy, args.quick, gemm_ms, args.gemm_scales),
            "decode": lambda: decode_section(copy, args.quick),
            "rmsnorm_kernels": lambda: rmsnorm_kernel_section(args.quick)}
    for name in sections:
        out[name] = runs[name]()
        if args.json:      # after every section: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
