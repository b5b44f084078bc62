"""L5: the ops inside torch.compile'd code captured in CUDA graphs, as a serving engine runs a
layer: inductor's own graphs (mode="reduce-overhead") and a compiled function captured by hand
and replayed over new inputs copied into its static ones; every output and the residual bit for
bit the eager calls'."""
import warnings

import pytest
import torch

from codegen import ops

from .gpu_data import poison_, rows_with_spread
from .test_gpu_gemm import quant_blocks

pytestmark = pytest.mark.gpu

T, H, QH, KVH = 48, 2048, 1536, 512


@pytest.fixture(scope="module")
def weights():
    gen = torch.Generator(device="cuda").manual_seed(7)
    w = torch.rand(H, device="cuda", generator=gen).to(torch.bfloat16) + 0.5
    b, sb = quant_blocks(torch.randn(H, H, device="cuda", generator=gen) * 0.05, 128)
    qw = torch.rand(QH, device="cuda", generator=gen).to(torch.bfloat16) + 0.5
    kvw = torch.rand(KVH, device="cuda", generator=gen).to(torch.bfloat16) + 0.5
    bq, sbq = quant_blocks(torch.randn(H, QH, device="cuda", generator=gen) * 0.05, 128)
    return w, b, sb, qw, kvw, bq, sbq


def layer(x, residual, latent, weights):
    """One block-FP8 layer's ops: every family, a residual updated in place (an intermediate,
    as in an engine's captured step), scales in the GEMM's column-major layout, quant into out=."""
    w, b, sb, qw, kvw, bq, sbq = weights
    r = residual.clone()
    y = ops.fused_add_rmsnorm(x, r, w)
    q, s = ops.rmsnorm_group_quant(y, w, 1e-6, 128, scale_layout="col_tma")
    z = ops.gemm_a8w8_blockscale(q, s, b, sb)
    q8 = torch.empty(z.shape, dtype=q.dtype, device=z.device)
    q2, s2 = ops.per_token_group_quant_fp8(z, 128, out=q8)
    z = ops.gemm_a8w8_blockscale(q2, s2, b, sb)
    lq, ls, kv = ops.dual_rmsnorm_group_quant(latent[:, :QH], qw, latent[:, QH:], kvw, 1e-6, 128)
    zq = ops.gemm_a8w8_blockscale(lq, ls, bq, sbq)
    return ops.rmsnorm(z + zq, w), r, kv


def inputs(seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (rows_with_spread(T, H, torch.bfloat16, gen=gen),
            rows_with_spread(T, H, torch.bfloat16, gen=gen),
            rows_with_spread(T, QH + KVH, torch.bfloat16, gen=gen))


def same(got, want, what: str) -> None:
    for i, (g, e) in enumerate(zip(got, want)):
        assert torch.equal(g, e), f"{what}: output {i} differs from the eager call's"


def test_reduce_overhead_graphs_equal_eager(weights):
    """torch.compile(mode="reduce-overhead"): inductor captures the layer in a CUDA graph (no
    op of ours makes it skip the capture) and replays it for new inputs; each call's outputs
    equal eager ones (cloned: the next replay overwrites them)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(lambda x, r, l: layer(x, r, l, weights), mode="reduce-overhead",
                      fullgraph=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for seed in range(5):
            args = inputs(seed)
            got = [t.clone() for t in f(*args)]
            same(got, layer(*args, weights), f"reduce-overhead call {seed}")
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    # dynamo traces the ops' checks; none of their lookups makes it warn
    assert not [str(w.message) for w in seen if "lru_cache" in str(w.message)]


def test_compiled_layer_captured_by_hand_replays_new_inputs(weights):
    """A compiled layer captured in a torch.cuda.graph over static inputs, then replayed with new
    inputs copied in (the outputs poisoned between replays): the eager calls' bytes each time."""
    f = torch.compile(lambda x, r, l: layer(x, r, l, weights), fullgraph=True)
    static = inputs(100)
    same(f(*static), layer(*static, weights), "compiled")   # compiles and warms up outside
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f(*static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = f(*static)
    for seed in range(101, 104):
        new = inputs(seed)
        for dst, src in zip(static, new):
            dst.copy_(src)
        for o in out:
            poison_(o)
        g.replay()
        torch.cuda.synchronize()
        same(out, layer(*new, weights), f"replay with inputs {seed}")
