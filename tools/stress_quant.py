"""Many fresh random inputs through every quant variant kind; prints any byte that differs."""
import itertools
import sys

import torch

sys.path.insert(0, ".")
from codegen import ops, reference  # noqa: E402
from tests.gpu_data import rows_with_spread  # noqa: E402

bad = 0
fp8 = ops.per_token_group_quant_fp8(torch.ones(1, 128, device="cuda"))[0].dtype
fmax = 224.0 if fp8 == torch.float8_e4m3fnuz else 448.0
for rep, dtype, g, ue8m0 in itertools.product(range(int(sys.argv[1]) if len(sys.argv) > 1 else 10),
                                              (torch.bfloat16, torch.float16, torch.float32),
                                              (32, 64, 128), (False, True)):
    x = rows_with_spread(2048, 4096, dtype)
    q, s = ops.per_token_group_quant_fp8(x, g, ue8m0=ue8m0)
    rq, rs = reference.group_quant_fp8(x, g, fp8, fmax, ue8m0)
    dq = (q.view(torch.uint8) != rq.view(torch.uint8)).nonzero()
    ds = (s.view(torch.int32) != rs.view(torch.int32)).nonzero()
    if len(dq) or len(ds):
        bad += 1
        print(f"MISMATCH dtype={dtype} g={g} ue8m0={ue8m0}: {len(dq)} bytes, {len(ds)} scales")
        for t, h in dq[:5].tolist():
            sc = s[t, h // g].item()
            print(f"  x={x[t, h].item()!r} scale={sc!r} ref_scale={rs[t, h // g].item()!r} "
                  f"x/scale={x[t, h].float().item() / sc!r} ours={q[t, h].float().item()} "
                  f"ref={rq[t, h].float().item()} bytes {q.view(torch.uint8)[t, h].item():#x} "
                  f"{rq.view(torch.uint8)[t, h].item():#x}")
print(f"stress: {bad} mismatching runs")
