"""Public ops. Each is a torch custom op (namespace `codegen`) with a fake implementation, so
torch.compile(fullgraph=True) and CUDA/HIP graph capture work; kernels run on the caller's
current stream and are built or loaded on first call."""
from .gemm import gemm_a8w8_blockscale  # noqa: F401
from .quant import per_token_group_quant_fp8  # noqa: F401
from .rmsnorm import (  # noqa: F401
    dual_rmsnorm_group_quant,
    fused_add_rmsnorm,
    rmsnorm,
    rmsnorm_group_quant,
)
