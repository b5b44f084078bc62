"""Test inputs as NUMERICS.md asks: fresh random, per-row spread, outliers, tiny rows."""
import torch

NAN_BYTE = 0xFF


def rows_with_spread(t: int, h: int, dtype, device="cuda", gen=None) -> torch.Tensor:
    x = torch.randn(t, h, device=device, generator=gen)
    x *= torch.exp2(torch.randint(-6, 7, (t, 1), device=device, generator=gen).float())
    if t >= 4:
        x[1, ::97] *= 1000.0          # outliers
        x[2] *= 1e-6                  # all-tiny row
    return x.to(dtype)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with a NaN pattern so unwritten elements show."""
    t.untyped_storage().fill_(NAN_BYTE)
    return t
