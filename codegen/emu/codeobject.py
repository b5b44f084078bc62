"""An AMDGPU code object (ELF) as the emulator needs it: the loaded image, each kernel's
descriptor (.kd symbol) and its metadata (the NT_AMDGPU_METADATA note, msgpack)."""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from pathlib import Path

# AMDGPU kernel descriptor (LLVM AMDGPUUsage, "Kernel Descriptor"): byte offsets of its fields.
KD_GROUP_SEGMENT = 0
KD_PRIVATE_SEGMENT = 4
KD_KERNARG_SIZE = 8
KD_ENTRY_OFFSET = 16
KD_RSRC3, KD_RSRC1, KD_RSRC2 = 44, 48, 52
KD_CODE_PROPERTIES = 56
KD_KERNARG_PRELOAD = 58        # bits 6:0 length, 15:7 offset, in dwords
KD_SIZE = 64

NT_AMDGPU_METADATA = 32
PT_LOAD = 1
SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11


class CodeObjectError(ValueError):
    pass


@dataclass(frozen=True)
class Kernel:
    name: str                  # the device symbol (mangled), as the host registers it
    kd_address: int            # absolute address of its descriptor in the loaded image
    entry: int                 # absolute address of its first instruction
    group_segment: int         # static LDS bytes
    private_segment: int       # scratch bytes per lane
    kernarg_size: int
    rsrc1: int
    rsrc2: int
    rsrc3: int
    code_properties: int
    preload_dwords: int        # kernarg dwords preloaded into user SGPRs (gfx90a / gfx94x)
    preload_offset: int        # from this dword of the kernarg segment
    args: tuple[dict, ...]     # metadata .args: .offset, .size, .value_kind, ...
    meta: dict                 # the whole metadata record of the kernel


class CodeObject:
    """Loads the image of a code object into host memory (PT_LOAD segments at their vaddrs)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        data = self.path.read_bytes()
        if data[:4] != b"\x7fELF" or data[4] != 2:
            raise CodeObjectError(f"{path}: not a 64-bit ELF code object")
        (self.e_machine,) = struct.unpack_from("<H", data, 18)
        phoff, shoff = struct.unpack_from("<QQ", data, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 54)
        segments = [struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
                    for i in range(phnum)]
        loads = [s for s in segments if s[0] == PT_LOAD]
        size = max(s[3] + s[6] for s in loads)        # p_vaddr + p_memsz
        self._image = ctypes.create_string_buffer(size + 256)
        self.base = (ctypes.addressof(self._image) + 255) & ~255
        for _, _, offset, vaddr, _, filesz, _, _ in loads:
            ctypes.memmove(self.base + vaddr, data[offset:offset + filesz], filesz)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                    for i in range(shnum)]
        self.symbols = self._symbols(data, sections)
        self.metadata = self._metadata(data, sections)
        self.kernels = {k[".name"]: self._kernel(k) for k in self.metadata["amdhsa.kernels"]}

    @staticmethod
    def _symbols(data: bytes, sections) -> dict[str, int]:
        out = {}
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind not in (SHT_SYMTAB, SHT_DYNSYM):
                continue
            strtab = sections[link]
            for i in range(size // entsize):
                name_off, _, _, _, value, _ = struct.unpack_from("<IBBHQQ", data,
                                                                 offset + i * entsize)
                start = strtab[4] + name_off
                name = data[start:data.index(b"\0", start)].decode()
                if name:
                    out[name] = value
        return out

    @staticmethod
    def _metadata(data: bytes, sections) -> dict:
        import msgpack

        for _, kind, _, _, offset, size, *_ in sections:
            pos, end = offset, offset + size
            while kind == SHT_NOTE and pos + 12 <= end:
                namesz, descsz, note_type = struct.unpack_from("<III", data, pos)
                desc = pos + 12 + (namesz + 3) // 4 * 4
                if note_type == NT_AMDGPU_METADATA:
                    return msgpack.unpackb(data[desc:desc + descsz], raw=False)
                pos = desc + (descsz + 3) // 4 * 4
        raise CodeObjectError("no NT_AMDGPU_METADATA note")

    def _kernel(self, meta: dict) -> Kernel:
        name = meta[".name"]
        kd_symbol = meta.get(".symbol", f"{name}.kd")
        if kd_symbol not in self.symbols:
            raise CodeObjectError(f"{self.path}: kernel {name} has no {kd_symbol} symbol")
        kd = self.base + self.symbols[kd_symbol]
        raw = ctypes.string_at(kd, KD_SIZE)

        def u32(off):
            return struct.unpack_from("<I", raw, off)[0]
        (entry_offset,) = struct.unpack_from("<q", raw, KD_ENTRY_OFFSET)
        (preload,) = struct.unpack_from("<H", raw, KD_KERNARG_PRELOAD)
        return Kernel(name=name, kd_address=kd, entry=kd + entry_offset,
                      group_segment=u32(KD_GROUP_SEGMENT), private_segment=u32(KD_PRIVATE_SEGMENT),
                      kernarg_size=u32(KD_KERNARG_SIZE), rsrc1=u32(KD_RSRC1), rsrc2=u32(KD_RSRC2),
                      rsrc3=u32(KD_RSRC3),
                      code_properties=struct.unpack_from("<H", raw, KD_CODE_PROPERTIES)[0],
                      preload_dwords=preload & 0x7F, preload_offset=preload >> 7,
                      args=tuple(meta.get(".args", ())), meta=meta)
