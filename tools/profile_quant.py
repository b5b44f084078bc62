"""Launches of the quant kernels for Nsight Compute, bf16, G=128: per_token_group_quant_fp8 at
8192x7168 (plain and ue8m0) and rmsnorm_group_quant at 4096x7168, each twice (the first call
builds). For example:

    ncu --clock-control none -k regex:quant_kernel -s 3 -c 3 --section SpeedOfLight \\
        --section WarpStateStats --section Occupancy python tools/profile_quant.py
"""
import torch

from codegen import ops

x = torch.randn(8192, 7168, device="cuda").to(torch.bfloat16)
xn, w = x[:4096], torch.randn(7168, device="cuda").to(torch.bfloat16)
for _ in range(2):
    for ue8m0 in (False, True):
        ops.per_token_group_quant_fp8(x, 128, ue8m0=ue8m0)
    ops.rmsnorm_group_quant(xn, w, 1e-6, 128)
torch.cuda.synchronize()
