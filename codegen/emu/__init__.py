"""Verification level L4: the generated gfx modules executed in an AMD ISA emulator.

Each variant is built twice from its one rendered source (codegen.build, outputs "co" and
"host"): the device half as a loadable code object, and the host half (the shipped launcher,
unchanged) for the CPU against hip_shim.hip, a HIP runtime that hands every launch here. So
the grid, block, LDS and prefetch decisions the emulator sees are the launcher's own.

The emulator is tinygrad's mock AMD GPU (its instruction semantics come from AMD's ISA
pseudocode), found at CODEGEN_AMD_EMULATOR; codegen.emu.gaps adjusts it where it departs from
the ISA documents. Tensors live in host memory: kernels read and write them in place.
"""
from __future__ import annotations

import ctypes
import struct
import sys
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .. import knobs
from ..targets import Target, get_target
from .codeobject import CodeObject, Kernel

# The emulator model that runs each target's code objects. gfx942 runs on the CDNA4 model
# (the same encodings for everything our kernels use) with FNUZ fp8 (codegen.emu.gaps).
MODELS = {"gfx942": "cdna", "gfx950": "cdna", "gfx1200": "rdna4", "gfx1201": "rdna4",
          "gfx1100": "rdna3", "gfx90a": "cdna"}
TINYGRAD_COMMIT = "a9069c177a9da9cca18593edf55acd2e6073cca6"
HOW_TO_GET = (
    "set CODEGEN_AMD_EMULATOR to a folder holding tinygrad at commit "
    f"{TINYGRAD_COMMIT} (git archive of tinygrad/, test/__init__.py, test/amd/, "
    "test/mockgpu/, extra/hip_gpu_driver/, LICENSE; `make emulator` unpacks one into "
    ".emulator/tinygrad), an executable `clang` on PATH, and `pip install msgpack`")


class EmulatorUnavailable(RuntimeError):
    pass


def unavailable_reason() -> str | None:
    """Why the emulator cannot run here, or None when it can."""
    root = knobs.amd_emulator()
    if root is None:
        return f"CODEGEN_AMD_EMULATOR is not set: {HOW_TO_GET}"
    if not (root / "test" / "mockgpu" / "amd" / "emu.py").exists():
        return f"CODEGEN_AMD_EMULATOR={root} holds no test/mockgpu/amd/emu.py: {HOW_TO_GET}"
    import importlib.util
    import shutil

    if importlib.util.find_spec("msgpack") is None:
        return "the msgpack package is missing (pip install msgpack)"
    if not shutil.which("clang"):
        return "no executable `clang` on PATH (the emulator compiles each instruction with it)"
    return None


@cache
def emulator():
    """tinygrad's emu module, imported from CODEGEN_AMD_EMULATOR, with our gap handling."""
    reason = unavailable_reason()
    if reason:
        raise EmulatorUnavailable(reason)
    root = str(knobs.amd_emulator().resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    from test.mockgpu.amd import emu

    from . import gaps

    gaps.install(emu)
    _guard_pages()
    return emu


_GUARD_BEFORE, _PAGE = 64 << 10, 4096


@cache
def _guard_pages() -> None:
    """The emulator's own buffers (register files, LDS, scratch) each between PROT_NONE pages,
    64 KiB before and a page after: its loads run for every lane and operand form, so an index
    outside a buffer faults where it happens, every run, not only where the address space
    happens to be unmapped there."""
    import mmap

    from tinygrad.helpers import mv_address
    from tinygrad.runtime import ops_cpu

    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    original = ops_cpu.CPUAllocator._alloc

    def alloc(self, size, options):
        if options.external_ptr is not None or sys.platform != "linux":
            return original(self, size, options)
        body = -(-size // _PAGE) * _PAGE
        buf = mmap.mmap(-1, _GUARD_BEFORE + body + _PAGE, mmap.MAP_ANON | mmap.MAP_SHARED,
                        mmap.PROT_READ | mmap.PROT_WRITE)
        base = mv_address(buf)
        if libc.mprotect(base, _GUARD_BEFORE, 0) or libc.mprotect(base + _GUARD_BEFORE + body,
                                                                  _PAGE, 0):
            raise OSError(ctypes.get_errno(), "mprotect of an emulator guard page failed")
        va = (base + _GUARD_BEFORE + body - size) & ~15   # ends within 16 bytes of the guard
        return ops_cpu.HCQBuffer(va, size, meta=buf, view=ops_cpu.MMIOInterface(va, size, fmt="B"),
                                 owner=self.dev)
    ops_cpu.CPUAllocator._alloc = alloc


@dataclass(frozen=True)
class Device:
    """An emulated GPU: the arch, and the size its launchers see in their occupancy queries."""
    arch: str
    cus: int = 4          # compute units: few, so that small problems fill and overflow it
    index: int = 0        # hipGetDevice's answer; launchers cache their queries per index

    @property
    def target(self) -> Target:
        return get_target(self.arch)


# A kernel launch the shim hands over: (name, grid[3], block[3], args, dynamic LDS bytes).
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint),
                           ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_void_p),
                           ctypes.c_size_t)
_OCCUPANCY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t)

# kernel_code_properties bits (LLVM AMDGPUUsage) and the user SGPRs each one asks for.
_USER_SGPRS = ((0, "private_segment_buffer", 4), (1, "dispatch_ptr", 2), (2, "queue_ptr", 2),
               (3, "kernarg_segment_ptr", 2), (4, "dispatch_id", 2), (5, "flat_scratch_init", 2),
               (6, "private_segment_size", 1))
_RSRC2_USER_SGPR_COUNT = (1, 0x1F)      # (shift, mask)
_RSRC2_LDS_SIZE = (15, 0x1FF)           # in 512-byte granules as the emulator reads it
_EXPLICIT = {"by_value", "global_buffer", "dynamic_shared_pointer"}


@dataclass
class Launch:
    """What one launch ran: variant, kernel, geometry, LDS. Tests read these to see which path
    ran."""
    uri: str
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: int


class Module:
    """One variant's code object and host launcher (one per process: the host library's
    registration and callbacks are process-wide), run on the device of each call."""

    _lock = threading.Lock()

    def __init__(self, code_object: Path, host_library: Path, symbol: str):
        self.emu = emulator()
        self.code = CodeObject(code_object)
        self.lib = ctypes.CDLL(str(host_library))
        self.launcher = getattr(self.lib, symbol)
        self.device: Device | None = None      # the current call's device
        self.launches: list[Launch] = []      # and its session's launch list
        self._error: BaseException | None = None
        self._callbacks = (_LAUNCH(self._on_launch), _OCCUPANCY(self._on_occupancy))
        self.lib.cg_emu_set_callbacks(*self._callbacks)

    def call(self, device: Device, launches: list, *args) -> int:
        """Calls the shipped launcher; every kernel it launches runs in the emulator."""
        with self._lock:
            self.device, self.launches, self._error = device, launches, None
            self.lib.cg_emu_set_device(device.index, device.cus, device.target.lds_bytes)
            rc = self.launcher(*args)
        if self._error is not None:
            raise self._error
        return rc

    def kernel(self, name: str) -> Kernel:
        try:
            return self.code.kernels[name]
        except KeyError:
            raise KeyError(f"{self.code.path}: no kernel {name} (has {list(self.code.kernels)})")

    def _on_occupancy(self, name: bytes, block: int, shmem: int) -> int:
        try:
            k = self.kernel(name.decode())
            t = self.device.target
            regs = k.meta.get(".vgpr_count", 1) + k.meta.get(".agpr_count", 0)
            lds = k.group_segment + shmem
            if lds > t.lds_bytes:
                return 0
            waves_per_block = -(-block // t.wave_size)
            return t.occupancy(regs, lds, block) * t.simds_per_cu // waves_per_block
        except BaseException as e:   # noqa: BLE001 - carried across the C boundary
            self._error = e
            return 0

    def _on_launch(self, name, grid, block, args, shmem) -> int:
        try:
            self._run(self.kernel(name.decode()), tuple(grid[:3]), tuple(block[:3]), args,
                      int(shmem))
            return 0
        except BaseException as e:   # noqa: BLE001 - carried across the C boundary
            self._error = e
            return 1

    def _run(self, k: Kernel, grid, block, args, shmem: int) -> None:
        self.launches.append(Launch(self.code.path.stem, k.name, grid, block, shmem))
        kernarg = ctypes.create_string_buffer(max(k.kernarg_size, 16))
        base = ctypes.addressof(kernarg)
        explicit = 0
        for a in k.args:
            kind, off, size = a[".value_kind"], a[".offset"], a[".size"]
            if kind in _EXPLICIT:
                ctypes.memmove(base + off, args[explicit], size)
                explicit += 1
                continue
            value = _hidden_value(kind, grid, block, shmem)
            if value is None:
                raise NotImplementedError(f"{k.name}: hidden argument {kind} is not modelled")
            struct.pack_into({2: "<H", 4: "<I", 8: "<Q"}[size], kernarg, off, value)
        user = []
        for bit, what, count in _USER_SGPRS:
            if what == "private_segment_size" and k.preload_dwords:
                user += list(struct.unpack_from(f"<{k.preload_dwords}I", kernarg,
                                                k.preload_offset * 4))
            if k.code_properties >> bit & 1:
                user += [base & 0xFFFFFFFF, base >> 32] if what == "kernarg_segment_ptr" \
                    else [0] * count
        shift, mask = _RSRC2_USER_SGPR_COUNT
        if self.device.arch.startswith("gfx11"):
            # LLVM pads gfx11's user SGPRs to 15 (a hardware bug needs 16 user + system SGPRs
            # set up); the padding holds nothing the code reads
            user += [0] * max(0, ((k.rsrc2 >> shift) & mask) - len(user))
        if len(user) != (k.rsrc2 >> shift) & mask:
            raise NotImplementedError(f"{k.name}: user SGPRs {k.rsrc2 >> shift & mask} != "
                                      f"the {len(user)} its code properties ask for")
        lds = k.group_segment + shmem
        if lds > self.device.target.lds_bytes:
            raise ValueError(f"{k.name}: {lds} bytes of LDS exceed {self.device.target.arch}'s "
                             f"{self.device.target.lds_bytes}")
        shift, mask = _RSRC2_LDS_SIZE
        rsrc2 = (k.rsrc2 & ~(mask << shift)) | (-(-lds // 512) << shift)
        from . import gaps

        with gaps.float_mode(k), gaps.fp8_format(self.device.arch):
            # with preloaded kernargs the CP starts 256 bytes into the code (AMDGPUUsage)
            entry = k.entry + (256 if k.preload_dwords else 0)
            rc = self.emu.run_asm(entry, 0, *grid, *block, base, rsrc2=rsrc2,
                                  scratch_size=k.private_segment,
                                  arch=MODELS[self.device.arch], user_data=user)
        if rc:
            raise RuntimeError(f"{k.name}: the emulator returned {rc}")


def _hidden_value(kind: str, grid, block, shmem: int) -> int | None:
    """The value the HIP runtime writes for a hidden kernel argument (code object v5)."""
    axis = "xyz".find(kind[-1]) if kind[-2:] in ("_x", "_y", "_z") else -1
    if kind.startswith("hidden_block_count_"):
        return grid[axis]
    if kind.startswith("hidden_group_size_"):
        return block[axis]
    if kind.startswith("hidden_remainder_"):
        return 0                      # grids are whole blocks
    if kind == "hidden_grid_dims":
        return 3 if grid[2] > 1 else 2 if grid[1] > 1 else 1
    if kind == "hidden_dynamic_lds_size":
        return shmem
    if kind.startswith("hidden_global_offset_") or kind in (
            "hidden_none", "hidden_printf_buffer", "hidden_hostcall_buffer",
            "hidden_multigrid_sync_arg", "hidden_default_queue", "hidden_completion_action",
            "hidden_heap_v1", "hidden_queue_ptr", "hidden_private_base", "hidden_shared_base"):
        return 0
    return None


_modules: dict = {}


def module(variant) -> Module:
    """The variant's emulator build (code object + CPU launcher), built or loaded once."""
    mod = _modules.get(variant)
    if mod is None:
        from ..build.jit import emu_outputs
        from ..families import get as get_family
        from ..render import symbol

        mod = Module(*emu_outputs(variant), symbol(variant))
        mod.launcher.argtypes = get_family(variant.family).ARGTYPES
        mod.launcher.restype = ctypes.c_int
        _modules[variant] = mod
    return mod


class Session:
    """An emulated device the ops run CPU tensors on (what dispatch.kernel is for a GPU), and
    the launches made on it."""

    def __init__(self, device: Device):
        self.device = device
        self.arch = device.arch
        self._launches: list[Launch] = []

    @property
    def multiprocessors(self) -> int:
        return self.device.cus

    def kernel(self, variant):
        mod = module(variant)
        return lambda *args: mod.call(self.device, self._launches, *args)

    def launches(self) -> list[Launch]:
        return list(self._launches)


def use(session: Session) -> Session:
    """From now on the ops run CPU tensors on this session's device (codegen.ops)."""
    from ..ops import _common

    emulator()
    _common.attach_emulated(session)
    return session


def attach(device: Device) -> Session:
    return use(Session(device))


def detach() -> None:
    from ..ops import _common

    _common.attach_emulated(None)
