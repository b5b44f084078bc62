"""Test inputs as docs/numerics.md asks: fresh random, per-row spread, outliers, tiny rows."""
import torch

from codegen.targets import device_arch, get_target

NAN_BYTE = 0xFF


def fp8_info() -> tuple[torch.dtype, float]:
    """The GPU's default FP8 format: (torch dtype, the max the ops scale to)."""
    fmt = get_target(device_arch(torch.device("cuda"))).fp8_formats[0]
    return getattr(torch, fmt.torch_dtype), fmt.max


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


def poison_pool(*nbytes: int) -> None:
    """Poison freed blocks of these sizes, so an op's outputs are allocated over NaN bytes: one
    block per output (the Python path's allocations) and one of them all, each 256-byte aligned
    (the C++ path carves a call's outputs out of one allocation)."""
    carved = sum((n + 255) // 256 * 256 for n in nbytes)
    junk = [poison_(torch.empty(n, dtype=torch.uint8, device="cuda"))
            for n in (*nbytes, carved) if n]
    del junk


def boundary_rows(t: int, g: int, dtype, fmax: float, fnuz: bool,
                  device="cuda") -> torch.Tensor:
    """Groups whose quotients x / scale fall on or beside fp8 rounding midpoints.

    Each group holds its amax, fmax * c (so scale = c, one of 1.25, 1.5, 1.75 per row, whose
    reciprocals are inexact), and values c m for fp8 midpoints m: normal ones 1.abc1 x 2^e, the
    subnormal ones below the smallest normal value; also zeros and values too small to round to
    anything but zero. In fp32 the values are moved up to 3 ulps off, so that the exact quotient
    lies on either side of the midpoint while x * (1 / scale) may land on the other.
    """
    emin = -7 if fnuz else -6
    mids = [(1 + (2 * k + 1) / 16) * 2.0 ** e for e in range(emin, 9) for k in range(8)]
    mids = [m for m in mids if m < fmax]
    mids += [(k + 0.5) * 2.0 ** (emin - 3) for k in range(8)] + [0.0, 2.0 ** -14]
    gen = torch.Generator().manual_seed(t * g)
    c = torch.tensor([1.25, 1.5, 1.75])[torch.randint(3, (t, 1), generator=gen)]
    x = torch.tensor(mids)[torch.randint(len(mids), (t, g), generator=gen)] * c
    if dtype == torch.float32:
        for _ in range(3):
            step = torch.randint(-1, 2, x.shape, generator=gen).float()
            x = torch.where(step == 0, x, torch.nextafter(x, x + step))
    x *= torch.where(torch.rand(t, g, generator=gen) < 0.5, -1.0, 1.0)
    x[torch.arange(t), torch.randint(g, (t,), generator=gen)] = fmax * c[:, 0]
    assert torch.equal(x.to(dtype).float(), x), "test values must be exact in the dtype"
    return x.to(dtype).to(device)
