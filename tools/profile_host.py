"""Host cost per call (cProfile) and pure GPU time (CUDA graph replay) of the RMSNorm ops."""
import cProfile
import pstats

import torch

from codegen import ops
from codegen.bench import host_us


def graph_us(fn, n=20):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / (10 * n)


bf = torch.bfloat16
q1, kv1 = torch.randn(1, 1536, device="cuda", dtype=bf), torch.randn(1, 512, device="cuda", dtype=bf)
qw, kw = torch.randn(1536, device="cuda", dtype=bf), torch.randn(512, device="cuda", dtype=bf)
x = torch.randn(4096, 7168, device="cuda", dtype=bf)
w = torch.randn(7168, device="cuda", dtype=bf)
x1 = torch.randn(1, 1536, device="cuda", dtype=bf)
cases = {
    "quant T=1": lambda: ops.per_token_group_quant_fp8(x1),
    "rmsnorm T=1": lambda: ops.rmsnorm(q1, qw),
    "rmsnorm_group_quant T=1": lambda: ops.rmsnorm_group_quant(q1, qw),
    "dual T=1": lambda: ops.dual_rmsnorm_group_quant(q1, qw, kv1, kw),
    "rmsnorm_group_quant 4096x7168": lambda: ops.rmsnorm_group_quant(x, w),
    "rmsnorm 4096x7168": lambda: ops.rmsnorm(x, w),
    "quant 4096x7168": lambda: ops.per_token_group_quant_fp8(x),
}
for name, fn in cases.items():
    print(f"{name:32s} host {host_us(fn):7.1f} us   gpu (graph) {graph_us(fn):7.2f} us")
pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    ops.dual_rmsnorm_group_quant(q1, qw, kv1, kw)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
