"""Run one GEMM config on one shape and compare with the reference (debugging aid).
Usage: python tools/debug_gemm.py KERNEL BM BN SPLIT_K STAGES M N K"""
import sys

import torch

from codegen import reference
from codegen.families.gemm import config
from codegen.ops.gemm import gemm_with_config
from tests.test_gpu_gemm import make, rel_err

kernel, bm, bn, sk, st, m, n, k = sys.argv[1], *map(int, sys.argv[2:])
a, sa, b, sb = make(m, n, k)
out = gemm_with_config(a, sa, b, sb, config(kernel, bm, bn, split_k=sk, stages=st))
torch.cuda.synchronize()
ref = reference.gemm_a8w8_blockscale(a, sa, b, sb)
bad = ~torch.isfinite(out)
print(kernel, bm, bn, sk, st, (m, n, k), "rel_err", rel_err(out.nan_to_num(), ref),
      "nonfinite", bad.sum().item(), "rows", bad.any(1).nonzero()[:8].flatten().tolist())
