"""One quant launch at 8192x7168 (bf16, G=128) for `ncu`: python tools/profile_quant.py"""
import torch

from codegen import ops

x = torch.randn(8192, 7168, device="cuda").to(torch.bfloat16)
for ue8m0 in (False, True):
    ops.per_token_group_quant_fp8(x, 128, ue8m0=ue8m0)
torch.cuda.synchronize()
