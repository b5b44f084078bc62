"""Time quant launch shapes on the local GPU: python tools/tune_quant.py

Sweeps groups per lane (ITEMS), loads per lane (LOADS) and the grid cap (GRID_WAVES), next to torch
elementwise kernels with the same traffic, so a gap can be placed."""
import itertools

import torch

import codegen.families.quant as fam
from codegen import dispatch, ops
from codegen.bench import bench_us, copy_bandwidth

copy = copy_bandwidth()
print(f"copy {copy:.0f} GB/s")
x = torch.randn(8192, 7168, device="cuda").to(torch.bfloat16)
y8 = torch.empty(x.shape, device="cuda", dtype=torch.float8_e4m3fn)
us = bench_us(lambda: y8.copy_(x))
print(f"torch bf16->fp8 cast 8192x7168: {us:.1f} us {x.numel() * 3 / us / 1e3 / copy:.0%} of copy")
us = bench_us(lambda: x.mul(2))
print(f"torch bf16 x*2 8192x7168: {us:.1f} us {x.numel() * 4 / us / 1e3 / copy:.0%} of copy")
for g, ue8m0, (t, h) in itertools.product((128,), (False,), ((8192, 7168), (16384, 4096),
                                                            (8192, 16384))):
    x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
    nbytes = t * h * 3 + t * h // g * 4
    row = []
    # the shipped config first and again last: the two show the drift over the sweep
    for items, loads, waves in ((1, 2, 0), (2, 2, 0), (1, 4, 0), (1, 2, 2), (1, 2, 4), (1, 2, 0)):
        fam.ITEMS, fam.LOADS, fam.GRID_WAVES = items, loads, waves
        ops._common._launchers.clear()
        dispatch._loaded.clear()
        us = bench_us(lambda: ops.per_token_group_quant_fp8(x, g, ue8m0=ue8m0))
        row.append(f"i{items}l{loads}w{waves}: {us:5.1f}us {nbytes / us / 1e3 / copy:4.0%}")
    print(f"G={g} ue8m0={ue8m0:d} {t}x{h}: " + " ".join(row))
