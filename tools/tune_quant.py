"""Time quant launch shapes (lanes' items, block size) on the local GPU: python tools/tune_quant.py"""
import itertools

import torch

import codegen.families.quant as fam
from codegen import dispatch, ops
from codegen.bench import bench_us, copy_bandwidth

copy = copy_bandwidth()
print(f"copy {copy:.0f} GB/s")
for g, (t, h) in itertools.product((128, 64), ((8192, 7168), (16384, 4096), (16, 7168))):
    x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
    nbytes = t * h * 3 + t * h // g * 4
    row = []
    for items, block in ((1, 256), (2, 256), (4, 256), (2, 512), (4, 128)):
        fam.ITEMS, fam.BLOCK = items, block
        ops.quant._launchers.clear()
        dispatch._loaded.clear()
        us = bench_us(lambda: ops.per_token_group_quant_fp8(x, g))
        row.append(f"i{items}b{block}: {us:6.1f}us {nbytes / us / 1e3 / copy:4.0%}")
    print(f"G={g} {t}x{h}: " + "  ".join(row))
