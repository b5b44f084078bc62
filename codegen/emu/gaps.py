"""Where the emulator departs from AMD's ISA documents for our kernels, and how we make it
follow them. Each fix is installed over the emulator's own functions (its files stay as they
are), can be switched off by name (`disabled`) so a test shows the difference it makes, and
quotes the ISA text that decides the behaviour.
"""
from __future__ import annotations

import contextlib
import functools

FIXES = ("fp8_convert", "fp8_fnuz", "fp8_unpack", "fp8_dot4", "wmma_fp8", "mfma_32x32_out",
         "mfma_acc_ab", "mfma_x2_decode", "global_inv", "float_denorm", "lds_inactive_lanes",
         "dpp_in_place", "permlane16_select", "permlane_swap", "ds_acc_data", "scratch_per_wave",
         "div_scale")
_off: set[str] = set()
_emu = None
_state = {"format": "ocp", "ftz": True, "scratch": 0}


@contextlib.contextmanager
def disabled(*names: str):
    """Runs the emulator as it is for these fixes (the tests of each fix use it)."""
    unknown = set(names) - set(FIXES)
    if unknown:
        raise ValueError(f"unknown fixes {sorted(unknown)}; known: {FIXES}")
    before = set(_off)
    _off.update(names)
    _flush_runners()
    try:
        yield
    finally:
        _off.clear()
        _off.update(before)
        _flush_runners()


def on(name: str) -> bool:
    return name not in _off


# ---- FP8 <-> f32 ----
# CDNA3 ISA (MI300), "V_CVT_PK_FP8_F32": converts to FP8 with round to nearest even; the FP8
# format of MI300 is E4M3 FNUZ ("exponent bias 8 ... 0x80 is NaN, there is no infinity and no
# negative zero"). CDNA4 and RDNA4 use the OCP E4M3 format (bias 7, S.1111.111 is NaN, no
# infinity). Results below the smallest normal are FP8 denormals, not zero: the emulator's
# generic conversion flushes them ("denormals are zero", tinygrad's f2f), so we encode here.
# Without the clamp bit, a magnitude beyond the largest finite value (and inf) gives NaN.

def _u32(v):
    from tinygrad.dtype import dtypes
    from tinygrad.uop.ops import UOp

    return UOp.const(v, dtypes.uint32)


def _f32_bits(v):
    from tinygrad.dtype import dtypes

    return (v.bitcast(dtypes.float32) if v.dtype != dtypes.float32 else v).bitcast(dtypes.uint32)


def f32_to_e4m3(v, bias: int, fnuz: bool):
    """f32 (value or bits) -> E4M3 byte, round to nearest even, denormals kept."""
    from tinygrad.dtype import dtypes

    bits = _f32_bits(v)
    sign, mag = bits >> _u32(31), bits & _u32(0x7FFFFFFF)
    exp = mag >> _u32(23)
    min_normal = 128 - bias                     # smallest FP8 normal exponent, f32-biased
    # normal results: drop 20 mantissa bits with round to nearest even, rebias the exponent
    rounded = mag + _u32(0x7FFFF) + ((mag >> _u32(20)) & _u32(1))
    normal = (rounded >> _u32(20)) - _u32((127 - bias) << 3)
    # below: a count of the smallest denormal 2^(1 - bias - 3), rounded to nearest even by the
    # float add of 2^23 (exact integer arithmetic in its low mantissa bits)
    scaled = mag.bitcast(dtypes.float32) * float(2 ** (bias + 2))
    denormal = (scaled + 8388608.0).bitcast(dtypes.uint32) - _u32(0x4B000000)
    code = (exp < _u32(min_normal)).where(denormal, normal)
    max_code = 0x7F if fnuz else 0x7E
    nan = (_u32(0x7F800000) < mag) | (_u32(max_code) < code)
    if fnuz:
        out = nan.where(_u32(0x80), code.eq(_u32(0)).where(_u32(0), code | (sign << _u32(7))))
    else:
        out = nan.where(_u32(0x7F), code) | (sign << _u32(7))
    return out.cast(dtypes.uint8)


def e4m3fnuz_to_f32(v):
    """E4M3 FNUZ byte -> f32: bias 8, 0x80 NaN, denormals m * 2^-10."""
    from tinygrad.dtype import dtypes

    b = v.cast(dtypes.uint32) & _u32(0xFF)
    sign, exp, mant = (b >> _u32(7)) << _u32(31), (b >> _u32(3)) & _u32(0xF), b & _u32(0x7)
    normal = sign | ((exp + _u32(127 - 8)) << _u32(23)) | (mant << _u32(20))
    denormal = (mant.cast(dtypes.float32) * 2.0 ** -10).bitcast(dtypes.uint32) | sign
    out = exp.eq(_u32(0)).where(denormal, normal)
    return b.eq(_u32(0x80)).where(_u32(0x7FC00000), out).bitcast(dtypes.float32)


def _fp8_funcs(originals: dict) -> dict:
    """The conversions in force for the current format and fixes."""
    funcs = dict(originals)
    if _state["format"] == "fnuz" and on("fp8_fnuz"):
        funcs["fp8_to_f32"] = e4m3fnuz_to_f32
        funcs["f32_to_fp8"] = functools.partial(f32_to_e4m3, bias=8, fnuz=True)
    elif on("fp8_convert"):
        funcs["f32_to_fp8"] = functools.partial(f32_to_e4m3, bias=7, fnuz=False)
    return funcs


# ---- FP8 pairs to f32 ----
# CDNA3 / CDNA4 / RDNA4 ISA, "V_CVT_PK_F32_FP8": converts two FP8 values, bytes 0 and 1 of the
# selected 16-bit word of S0 (word 0 without SDWA / op_sel), into two f32 results in D and D+1.
# The emulator's CDNA model stops on the 64-bit destination written in two halves ("multiple
# stores"), its RDNA4 model on an operand it does not know. We compile the unselected form. On
# CDNA S0 is a 32-bit register, v128-v255 included; the emulator's 16-bit source read takes
# those as the high halves of v0-v127 (RDNA's true16 encoding), which the 4-row decode GEMM's
# conversions from v128 on came out as.

def _cvt_pk_f32_fp8(inst, ctx):
    from test.mockgpu.amd import pcode
    from tinygrad.dtype import dtypes
    from tinygrad.uop.ops import UOp

    cvt = pcode._FUNCS["fp8_to_f32"]
    lane, exec_mask = ctx.range(), ctx.rexec()
    vdst = ctx.inst_field(type(inst).vdst)
    literal = ctx.optional_field(inst, "literal")
    if ctx.wave_size == 64:   # CDNA
        s0 = ctx.rsrc_dyn(ctx.inst_field(type(inst).src0), lane, 32, literal=literal)
    else:
        s0, _ = _emu._load_vsrc0(ctx, inst, lane, inst.canonical_op_bits, literal, False, False,
                                 _u32(0))
    s0 = s0.cast(dtypes.uint32) if s0.dtype != dtypes.uint32 else s0
    lo = cvt(s0 & _u32(0xFF)).bitcast(dtypes.uint32)
    hi = cvt((s0 >> _u32(8)) & _u32(0xFF)).bitcast(dtypes.uint32)
    stores = [ctx.wvgpr_dyn(vdst, lane, lo, exec_mask),
              ctx.wvgpr_dyn(vdst + _u32(1), lane, hi, exec_mask)]
    return UOp.sink(UOp.group(*stores).end(lane), *ctx.inc_pc())


# ---- CDNA4 V_PERMLANE16_SWAP_B32 / V_PERMLANE32_SWAP_B32 ----
# CDNA4 ISA pseudocode: "for pass in 0 : 1 do for lane in 0 : 15 do tmp = VGPR[pass * 32 +
# lane][SRC0.u32]; VGPR[pass * 32 + lane][SRC0.u32] = VGPR[pass * 32 + lane + 16][VDST.u32];
# VGPR[pass * 32 + lane + 16][VDST.u32] = tmp" (16: rows 0 and 2 of SRC0 trade with rows 1 and
# 3 of VDST), and lanes 0-31 of SRC0 with lanes 32-63 of VDST (32); no EXEC in it. The
# emulator's pseudocode compiler does not know the SRC0 / VDST names these use and stops on
# them; we compile them ourselves (VGPR operands, the e32 form).

def _permlane_swap(inst, ctx):
    from tinygrad.dtype import dtypes
    from tinygrad.uop.ops import UOp

    half = 16 if "PERMLANE16" in _emu._op_name(inst) else 32
    kind = type(inst)
    src, dst = ctx.inst_field(kind.src0) - _u32(256), ctx.inst_field(kind.vdst)
    src_copy, dst_copy = _lanes_copied(ctx, src, slot=0), _lanes_copied(ctx, dst, slot=1)
    lane = ctx.range()
    partner = lane ^ UOp.const(half, dtypes.int)
    upper = UOp.const(half - 1, dtypes.int) < lane % UOp.const(2 * half, dtypes.int)
    new_src = upper.where(src_copy.index(lane).load(), dst_copy.index(partner).load())
    new_dst = upper.where(src_copy.index(partner).load(), dst_copy.index(lane).load())
    every_lane = ctx.rexec().const_like(-1)
    stores = [ctx.wvgpr_dyn(src, lane, new_src, every_lane),
              ctx.wvgpr_dyn(dst, lane, new_dst, every_lane)]
    return UOp.sink(UOp.group(*stores).end(lane), *ctx.inc_pc())


def _vop1(original):
    def compile_vop1(inst, ctx):
        if (on("fp8_unpack") and type(inst).__name__ == "VOP1"
                and _emu._op_name(inst) == "V_CVT_PK_F32_FP8_E32"):
            return _cvt_pk_f32_fp8(inst, ctx)
        if on("permlane_swap") and type(inst).__name__ == "VOP1" and _emu._op_name(inst) in (
                "V_PERMLANE16_SWAP_B32_E32", "V_PERMLANE32_SWAP_B32_E32"):
            return _permlane_swap(inst, ctx)
        if on("dpp_in_place") and type(inst).__name__ in ("VOP1_DPP16", "VOP2_DPP16"):
            return original(inst, _dpp_source_copied(ctx, inst))
        return original(inst, ctx)
    return compile_vop1


# ---- RDNA4 FP8 dot products ----
# RDNA4 ISA, "V_DOT4_F32_FP8_FP8" (and the FP8 / BF8 mixes): tmp = S2.f32, then
# tmp += 32'F(S0[8i+7 : 8i].fp8) * 32'F(S1[8i+7 : 8i].fp8) for bytes i = 0 .. 3 in turn,
# D = tmp: the bytes are FP8 values. The emulator's pseudocode reads `.fp8` as an 8-bit integer,
# so 0x38 (1.0) counted as 56. We compile it ourselves (sources without modifiers, as our code
# has them).

def _dot4_f32_fp8(inst, ctx):
    from test.mockgpu.amd import pcode
    from tinygrad.dtype import dtypes
    from tinygrad.uop.ops import UOp

    name = _emu._op_name(inst)
    if any(int(_emu._iattr(inst, f)) for f in ("opsel", "neg", "neg_hi", "clmp")):
        raise RuntimeError(f"{name.lower()}: only sources without modifiers are emulated")
    a_fmt, b_fmt = name.split("_")[-2:]
    cvt_a = pcode._FUNCS[f"{a_fmt.lower()}_to_f32"]
    cvt_b = pcode._FUNCS[f"{b_fmt.lower()}_to_f32"]
    kind = type(inst)
    lane, exec_mask = ctx.range(), ctx.rexec()
    literal = ctx.optional_field(inst, "literal")
    s0, s1, s2 = (ctx.rsrc_dyn(ctx.inst_field(getattr(kind, f)), lane, 32, literal=literal)
                  for f in ("src0", "src1", "src2"))
    s0, s1, s2 = (v.cast(dtypes.uint32) if v.dtype != dtypes.uint32 else v for v in (s0, s1, s2))
    tmp = s2.bitcast(dtypes.float32)
    for i in range(4):
        shift = _u32(8 * i)
        tmp = tmp + cvt_a((s0 >> shift) & _u32(0xFF)) * cvt_b((s1 >> shift) & _u32(0xFF))
    store = ctx.wvgpr_dyn(ctx.inst_field(kind.vdst), lane, tmp.bitcast(dtypes.uint32), exec_mask)
    return UOp.sink(store.end(lane), *ctx.inc_pc())


def _vop3p(original):
    def compile_vop3p(inst, ctx):
        if on("fp8_dot4") and _emu._op_name(inst).startswith("V_DOT4_F32_") and (
                _emu._op_name(inst)[-7:] in ("FP8_FP8", "FP8_BF8", "BF8_FP8", "BF8_BF8")):
            return _dot4_f32_fp8(inst, ctx)
        return original(inst, ctx)
    return compile_vop3p


# ---- RDNA V_PERMLANE16_B32 / V_PERMLANEX16_B32 ----
# RDNA3 / RDNA4 ISA: lane i of each 16-lane row takes lane sel(i) of the same row (PERMLANE16)
# or of the other row of its pair (PERMLANEX16), sel(i) being nibble i of {S2, S1}; S0 is read
# for every lane before D is written. The emulator's compile of them reads S1 and S2 without
# the instruction's literal, so a select given as a literal (as LLVM emits 0xfedcba98) came out
# wrong. We compile them with FI and BC clear (as our code has them).

def _permlane16(inst, ctx):
    from tinygrad.dtype import dtypes
    from tinygrad.uop.ops import UOp

    name = _emu._op_name(inst)
    if int(_emu._iattr(inst, "opsel")):
        raise RuntimeError(f"{name.lower()}: only FI = BC = 0 is emulated")
    kind, exec_mask = type(inst), ctx.rexec()
    literal = ctx.optional_field(inst, "literal")
    sel_lo, sel_hi = (ctx.rsrc_dyn(ctx.inst_field(getattr(kind, f)), None, 32, literal=literal)
                      for f in ("src1", "src2"))
    copy = _lanes_copied(ctx, ctx.inst_field(kind.src0) - _u32(256))
    lane = ctx.range()
    i = (lane % UOp.const(16, dtypes.int)).cast(dtypes.uint32)
    sel = (i < _u32(8)).where(sel_lo >> (i * _u32(4)), sel_hi >> ((i - _u32(8)) * _u32(4)))
    row = lane // UOp.const(16, dtypes.int)
    if "X16" in name:
        row = row ^ UOp.const(1, dtypes.int)
    value = copy.index(row * UOp.const(16, dtypes.int) + (sel & _u32(15)).cast(dtypes.int)).load()
    store = ctx.wvgpr_dyn(ctx.inst_field(kind.vdst), lane, value, exec_mask)
    return UOp.sink(store.end(lane), *ctx.inc_pc())


def _vop3(original):
    def compile_vop3(inst, ctx):
        if on("permlane16_select") and _emu._op_name(inst) in ("V_PERMLANE16_B32",
                                                               "V_PERMLANEX16_B32"):
            return _permlane16(inst, ctx)
        return original(inst, ctx)
    return compile_vop3


# ---- per-format compiled-instruction caches ----
# The emulator compiles each instruction once per process and keys the result by its bytes and
# model alone; gfx942 and gfx950 share the CDNA model but not the FP8 format, and a disabled
# fix changes what an instruction does, so each (format, fixes) state keeps its own cache.
_runner_caches: dict = {}


def _flush_runners() -> None:
    if _emu is None:
        return
    from test.mockgpu.amd import pcode

    state = (_state["format"], frozenset(_off))
    if state not in _runner_caches:
        _runner_caches[state] = (functools.cache(_emu._get_runner.__wrapped__), [])
    _emu._get_runner, _emu._canonical_runner_cache = _runner_caches[state]
    pcode._FUNCS.update(_fp8_funcs(_ORIGINAL_FUNCS))


_ORIGINAL_FUNCS: dict = {}


@contextlib.contextmanager
def fp8_format(arch: str):
    """The FP8 format of arch's code while it runs: FNUZ for gfx942, OCP elsewhere."""
    fmt = "fnuz" if arch == "gfx942" else "ocp"
    before = _state["format"]
    if fmt != before:
        _state["format"] = fmt
        _flush_runners()
    try:
        yield
    finally:
        if fmt != before:
            _state["format"] = before
            _flush_runners()


# ---- RDNA4 WMMA with FP8 inputs ----
# RDNA4 ISA, "V_WMMA_F32_16X16X16_FP8_FP8": D = A * B + C, A and B in FP8 (E4M3), 8 values per
# lane in two VGPRs (operand format FMT_WMMA_AB_16X16_FP8, 64 bits); C and D f32, 8 VGPRs. The
# emulator decodes every F32 WMMA's A and B as f16, and reads an inline-constant C (the encoded
# 0 that starts an accumulation) as VGPRs 128.., so a kernel using those registers gets their
# contents added. We compile it ourselves, with the lane layout of codegen/matrix.py (AMD's, as
# the Matrix Instruction Calculator gives it): lane l holds row / column l % 16, K bytes
# 8 (l / 16) .. 8 (l / 16) + 7; D row 8 (l / 16) + r, column l % 16 in VGPR r.

def _wmma_fp8(inst, ctx):
    from test.mockgpu.amd import pcode
    from tinygrad.dtype import dtypes
    from tinygrad.uop.ops import UOp

    a_fmt, b_fmt = inst.op.name.rsplit("_", 2)[-2:]
    cvt_a = pcode._FUNCS[f"{a_fmt.lower()}_to_f32"]
    cvt_b = pcode._FUNCS[f"{b_fmt.lower()}_to_f32"]
    kind = type(inst)
    exec_mask = ctx.rexec()
    vdst = ctx.inst_field(kind.vdst)
    src0, src1 = (ctx.inst_field(kind.src0) - _u32(256)), (ctx.inst_field(kind.src1) - _u32(256))
    src2 = ctx.inst_field(kind.src2)
    c_in_vgprs = ((src2 >> _u32(8)) & _u32(1)).eq(_u32(1))   # else an inline constant: 0
    c_base = src2 & _u32(0xFF)

    def lane(i):
        return UOp.const(i, dtypes.int)

    def element(src, cvt, row, k):
        word = ctx.rvgpr_dyn(src + _u32((k % 8) // 4), lane(row + 16 * (k // 8)))
        return cvt((word >> _u32(8 * (k % 4))) & _u32(0xFF))

    a = [[element(src0, cvt_a, m, k) for k in range(16)] for m in range(16)]
    b = [[element(src1, cvt_b, n, k) for k in range(16)] for n in range(16)]
    stores = []
    for m in range(16):
        for n in range(16):
            where = (lane(n + 16 * (m // 8)), m % 8)
            c = c_in_vgprs.where(ctx.rvgpr_dyn(c_base + _u32(where[1]), where[0]),
                                 _u32(0)).bitcast(dtypes.float32)
            d = sum((a[m][k] * b[n][k] for k in range(1, 16)), a[m][0] * b[n][0]) + c
            stores.append(ctx.wvgpr_dyn(vdst + _u32(where[1]), where[0],
                                        d.bitcast(dtypes.uint32), exec_mask))
    return UOp.sink(*stores, *ctx.inc_pc())


def _wmma(original):
    def compile_wmma(inst, ctx):
        name = inst.op.name
        if on("wmma_fp8") and name.startswith("V_WMMA_F32_16X16X16_") and (
                name.endswith("8_FP8") or name.endswith("8_BF8")):
            return _wmma_fp8(inst, ctx)
        return original(inst, ctx)
    return compile_wmma


# ---- CDNA 32 x 32 MFMA accumulators ----
# AMD's Matrix Instruction Calculator (CDNA3, v_mfma_f32_32x32x16_fp8_fp8, D matrix): rows 0-3
# of D are in registers 0-3 of lanes 0-31, rows 4-7 in registers 0-3 of lanes 32-63, rows 8-11
# in registers 4-7 of lanes 0-31, ...: row 8 (r / 4) + 4 (lane / 32) + r % 4 in register r,
# column lane % 32; CDNA4's v_mfma_f32_32x32x64_f8f6f4 keeps D the same way. The emulator places
# row 16 (lane / 32) + r there. We compile the FP8 ones ourselves: with B bytes of a row per
# lane (8, or 32 for the f8f6f4 one) and K = 2 B, A[i][k] is byte k % B of lane i + 32 (k / B)'s
# operand; B likewise. (The f8f6f4 instruction's own K order within a lane differs; any order
# shared by A and B gives the same sums, and the kernel feeds both alike.)
# "mfma_acc_ab": the VOP3P-MAI encoding's ACC bits (59 for SrcA, 60 for SrcB, as LLVM encodes
# them for gfx90a and later) say an operand is in AGPRs; the emulator reads VGPRs whatever they
# say. The compiler puts A or B there when a tile needs more than 256 registers (the 64 x 64
# lds wave tile, 64 x 64 mma tiles on 16x16x32). The 16 x 16 forms with an operand there are
# compiled here too: A[i][k] is byte k % B of lane i + 16 (k / B)'s operand, D row
# 4 (lane / 16) + r in register r, column lane % 16 (the Calculator's layout, which the
# emulator's own 16 x 16 path has right).
# (rows, bytes of a row per lane) of each FP8 form compiled here
_MFMA_FP8 = {"V_MFMA_F32_32X32X16_FP8_FP8": (32, 8), "V_MFMA_F32_32X32X64_F8F6F4": (32, 32),
             "V_MFMA_F32_16X16X32_FP8_FP8": (16, 8), "V_MFMA_F32_16X16X128_F8F6F4": (16, 32)}


def _mfma_fp8(inst, ctx, rows, lane_bytes):
    from test.mockgpu.amd import pcode
    from tinygrad.dtype import dtypes
    from tinygrad.uop.ops import UOp

    if lane_bytes == 32 and (int(inst.cbsz) or int(inst.blgp)):
        raise RuntimeError(f"{inst.op.name.lower()}: only FP8 (E4M3) A and B are emulated")
    cvt = pcode._FUNCS["fp8_to_f32"]
    kind = type(inst)
    exec_mask = ctx.rexec()
    vdst = ctx.inst_field(kind.vdst)
    src0, src1 = (ctx.inst_field(kind.src0) - _u32(256)), (ctx.inst_field(kind.src1) - _u32(256))
    src2 = ctx.inst_field(kind.src2)
    acc = bool(_emu._iattr(inst, "acc_cd"))
    read_c, write_d = (ctx.raccvgpr_dyn, ctx.waccvgpr_dyn) if acc else (ctx.rvgpr_dyn,
                                                                          ctx.wvgpr_dyn)
    c_in_regs = src2 >= _u32(256)                       # else an inline constant: 0
    # an inline constant's C reads register 0 and drops it: the loads run either way, and
    # src2 - 256 would reach 128 registers before the file
    c_base = c_in_regs.where(src2 - _u32(256), _u32(0))
    groups = 64 // rows                                 # lanes holding one row, K-wise
    k_all = groups * lane_bytes
    in_agprs = int(_emu._iattr(inst, "acc")) if on("mfma_acc_ab") else 0

    def lane(i):
        return UOp.const(i, dtypes.int)

    def element(src, agpr, index, k):
        read = ctx.raccvgpr_dyn if agpr else ctx.rvgpr_dyn
        word = read(src + _u32((k % lane_bytes) // 4), lane(index + rows * (k // lane_bytes)))
        return cvt((word >> _u32(8 * (k % 4))) & _u32(0xFF))

    a = [[element(src0, in_agprs & 1, i, k) for k in range(k_all)] for i in range(rows)]
    b = [[element(src1, in_agprs & 2, j, k) for k in range(k_all)] for j in range(rows)]
    stores = []
    for i in range(rows):
        for j in range(rows):
            where = lane(j + rows * ((i // 4) % groups))
            reg = 4 * (i // (4 * groups)) + i % 4
            c = c_in_regs.where(read_c(c_base + _u32(reg), where), _u32(0)).bitcast(
                dtypes.float32)
            d = sum((a[i][k] * b[j][k] for k in range(1, k_all)), a[i][0] * b[j][0]) + c
            stores.append(write_d(vdst + _u32(reg), where, d.bitcast(dtypes.uint32), exec_mask))
    return UOp.sink(*stores, *ctx.inc_pc())


def _mfma(original):
    def compile_mfma(inst, ctx):
        name = inst.op.name
        if name in _MFMA_FP8 and (on("mfma_32x32_out") if _MFMA_FP8[name][0] == 32 else
                                  on("mfma_acc_ab") and int(_emu._iattr(inst, "acc"))):
            return _mfma_fp8(inst, ctx, *_MFMA_FP8[name])
        return original(inst, ctx)
    return compile_mfma


# ---- CDNA4 scaled MFMA decoding ----
# A scaled MFMA (VOP3PX2) is two 64-bit words: V_MFMA_LD_SCALE_B32 (VOP3P opcode 44, the scale
# operands) followed by the MFMA. The emulator recognises the pair by the second word alone, so
# whatever 8 bytes come right before an f8f6f4 MFMA (another unscaled one, a V_PK_FMA_F32, two
# 32-bit instructions) decode as one scaled instruction: they never run, nor does the MFMA. We
# take the pair only when the first word is V_MFMA_LD_SCALE_B32, and otherwise decode what is
# there by the emulator's other formats.
_LD_SCALE_WORD = (0b110100111 << 7) | 44      # bits 31:16 of V_MFMA_LD_SCALE_B32


def _decode(original):
    def decode_inst(data, arch="rdna3"):
        if arch == "rdna3" and on("global_inv"):
            inst = _rdna3_cache_op(data)
            if inst is not None:
                return inst
        inst = original(data, arch)
        if (on("mfma_x2_decode") and type(inst).__name__ == "VOP3PX2"
                and int.from_bytes(data[:4], "little") >> 16 != _LD_SCALE_WORD):
            from tinygrad.renderer import amd

            return next(cls for cls in amd._load_formats()[arch] if cls is not type(inst)
                        and amd._matches(data, cls)).from_bytes(data)
        return inst
    return decode_inst


# ---- cache invalidations: RDNA4 GLOBAL_INV / GLOBAL_WB / GLOBAL_WBINV, RDNA3 BUFFER_GL*_INV ----
# RDNA4 ISA: GLOBAL_INV "invalidate the cache(s) ... at the scope given"; GLOBAL_WB writes back
# dirty lines. RDNA3 ISA: BUFFER_GL0_INV / BUFFER_GL1_INV invalidate the GL0 / GL1 caches (what a
# workgroup-scope acquire emits after a barrier in WGP mode). They move no data between registers
# and memory, and the emulator has no caches: for it they are no-ops (its RDNA4 model has no
# entry for the first ones and stops; its RDNA3 decoder has no MUBUF format and stops).
_CACHE_OPS = ("GLOBAL_INV", "GLOBAL_WB", "GLOBAL_WBINV", "BUFFER_GL0_INV", "BUFFER_GL1_INV")


def _rdna3_cache_op(data):
    """RDNA3's BUFFER_GL0_INV / BUFFER_GL1_INV decoded as its MUBUF instruction, else None."""
    from tinygrad.runtime.autogen.amd.rdna3 import ins

    word = int.from_bytes(data[:4], "little")
    ops = (ins.MUBUFOp.BUFFER_GL0_INV.value, ins.MUBUFOp.BUFFER_GL1_INV.value)
    if word >> 26 != 0b111000 or (word >> 18) & 0xFF not in ops:
        return None
    return ins.MUBUF.from_bytes(data)


# ---- LDS addresses of lanes EXEC leaves out ----
# RDNA4 and CDNA3 ISA documents, on the EXEC mask (paraphrased): vector instructions, memory and
# LDS ones included, act only for the lanes whose EXEC bit is 1. The emulator reads LDS at every
# lane's address and masks only the results, so an inactive lane's stale address register (never
# written for that lane) indexes outside its LDS buffer: a process crash. Such lanes now address
# LDS word 0.


class _RegisterView:
    """An instruction context whose VGPR reads of the given register expressions go through
    read(reg, lane, valid)."""
    __slots__ = ("_ctx", "_regs", "_read")

    def __init__(self, ctx, regs, read):
        self._ctx, self._regs, self._read = ctx, regs, read

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def rvgpr_dyn(self, reg, lane, valid=None):
        if any(reg is r for r in self._regs):
            return self._read(reg, lane, valid)
        return self._ctx.rvgpr_dyn(reg, lane, valid)


def _active_lane_addresses(ctx, inst):
    """ctx with the DS address register reading 0 for inactive lanes."""
    addr, exec_mask = ctx.inst_field(type(inst).addr), ctx.rexec()

    def read(reg, lane, valid):
        value = ctx.rvgpr_dyn(reg, lane, valid)
        return _emu._lane_active(exec_mask, lane).where(value, value.const_like(0))
    return _RegisterView(ctx, (addr,), read)


# ---- DS stores from AGPRs ----
# CDNA3 ISA, DS instructions: ACC (bit 25) "return to / source from accumulation VGPRs" — with
# it set, the data operands name AGPRs. The emulator's global and flat paths honour the bit; its
# DS path reads DATA with the VGPR reader whatever the bit says. Tiles over 256 registers make
# the compiler stage A and B pieces from AGPRs (`ds_write_b128 v29, a[0:3]`), which then stored
# whatever the VGPRs of those numbers held.

def _ds_data_from_agprs(ctx, inst):
    """ctx with a DS instruction's data operands (DATA0, DATA1 and the dwords after them, built
    as the emulator builds them) read from the AGPRs."""
    from tinygrad.uop.ops import UOp

    kind = type(inst)
    regs = []
    for field in (kind.data0, kind.data1):
        base = ctx.inst_field(field)
        regs += [base, *(base + UOp.const(i, base.dtype) for i in range(1, 4))]
    return _RegisterView(ctx, regs, ctx.raccvgpr_dyn)


# ---- DPP whose destination is its source ----
# AMD ISA documents on DPP: the instruction reads every lane's shifted source before it writes
# any lane, so `v_add_f32_dpp v1, v1, v1 quad_perm:[2,3,0,1]` adds the values v1 held before it.
# The emulator reads and writes lane by lane in one loop, so where the destination is the
# source, a lane whose source lane came earlier in the loop read that lane's new value. The
# source register is now copied for every lane first.

def _lanes_copied(ctx, reg, slot: int = 0):
    """Register reg of every lane, copied into a local array (one per slot) before the
    instruction writes (call it before the instruction's own lane range: a lower axis id runs
    first)."""
    from tinygrad.dtype import AddrSpace, dtypes
    from tinygrad.uop.ops import UOp

    lane = ctx.range()
    copy = UOp.placeholder((ctx.wave_size,), dtypes.uint32, slot=slot, addrspace=AddrSpace.LOCAL)
    return copy.after(copy.index(lane).store(ctx.rvgpr_dyn(reg, lane)).end(lane))


def _dpp_source_copied(ctx, inst):
    """ctx with the DPP source register read from a copy taken before the instruction's writes."""
    src = ctx.inst_field(type(inst).vsrc0)
    copy = _lanes_copied(ctx, src)
    return _RegisterView(ctx, (src,), lambda reg, lane, valid: copy.index(lane).load())


# ---- scratch per wave ----
# CDNA3 and RDNA4 ISA documents, scratch instructions: they access private memory, a region of
# its own for each work-item (the hardware gives each wave its own slot of the scratch ring). The
# emulator kept one region for a wave's lanes per launch, addressed by the lane alone, so the
# waves of a workgroup, run in turns between barriers, overwrote each other's spills. Each wave
# now gets its own, at a base _init_wave puts in an SGPR-file slot no operand encoding names.
_SCRATCH_BASE = 220


def _run_asm(original):
    def run_asm(lib, lib_sz, gx, gy, gz, lx, ly, lz, args_ptr, *rest, scratch_size=0, **kw):
        if not (scratch_size and on("scratch_per_wave")):
            return original(lib, lib_sz, gx, gy, gz, lx, ly, lz, args_ptr, *rest,
                            scratch_size=scratch_size, **kw)
        waves = -(-(lx * ly * lz) // _emu._wave_size(kw.get("arch", "rdna3")))
        _state["scratch"] = scratch_size
        try:   # a buffer of every wave's lanes; the stride stays scratch_size (below)
            return original(lib, lib_sz, gx, gy, gz, lx, ly, lz, args_ptr, *rest,
                            scratch_size=scratch_size * waves, **kw)
        finally:
            _state["scratch"] = 0
    return run_asm


def _init_wave(original):
    def init_wave(lib, wave_start, *rest):
        st = original(lib, wave_start, *rest)
        if _state["scratch"]:
            st._write_sgpr(_emu.SCRATCH_STRIDE_IDX, _state["scratch"])
            st._write_sgpr(_SCRATCH_BASE, wave_start * _state["scratch"])
        return st
    return init_wave


class _ScratchView:
    """An instruction context whose scratch offset field adds the wave's base."""
    __slots__ = ("_ctx", "_field")

    def __init__(self, ctx, field):
        self._ctx, self._field = ctx, field

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def inst_field_signed(self, field):
        value = self._ctx.inst_field_signed(field)
        if field is not self._field:
            return value
        base = self._ctx.rsgpr_dyn(_u32(_SCRATCH_BASE))
        return value + base.cast(value.dtype)


def _mem_op(original):
    def compile_mem_op(inst, ctx):
        from tinygrad.uop.ops import UOp

        name = getattr(inst.op, "name", "")
        if on("global_inv") and name in _CACHE_OPS:
            return UOp.sink(*ctx.inc_pc())
        if (on("ds_acc_data") and name.startswith("DS_") and "acc" in type(inst).__dict__
                and int(_emu._iattr(inst, "acc"))):
            ctx = _ds_data_from_agprs(ctx, inst)
        if on("scratch_per_wave") and type(inst).__name__ in ("SCRATCH", "VSCRATCH"):
            kind = type(inst)
            ctx = _ScratchView(ctx, getattr(kind, "ioffset", None) or kind.offset)
        # (not the lane-exchange forms, whose ADDR names another lane's register, not LDS)
        if on("lds_inactive_lanes") and name.startswith("DS_") and not any(
                x in name for x in ("PERMUTE", "SWIZZLE")):
            return original(inst, _active_lane_addresses(ctx, inst))
        return original(inst, ctx)
    return compile_mem_op


# ---- V_DIV_SCALE_F32 ----
# The ISA's pseudocode (CDNA3 and RDNA4 ISA, "V_DIV_SCALE_F32"), two of its branches:
#   elsif S2.f32 / S1.f32 == DENORM.f32 then VCC = 0x1LL;
#     if S0.f32 == S2.f32 then // Only scale the numerator  D0.f32 = ldexp(S0.f32, 64) endif
#   elsif exponent(S2.f32) <= 23 then // Numerator is tiny  D0.f32 = ldexp(S0.f32, 64)
# The emulator's own correction of that text (its _fix_div_scale) sets VCC in the tiny-numerator
# branch, and leaves the numerator unscaled where the quotient would be denormal: an IEEE
# division of a tiny sum (RMSNorm's mean of squares of rows near 2^-56, H not a power of two)
# came out 2^64 too large, inf. We put those two branches back as the ISA states them.
_DIV_SCALE = (("elsif exponent(S2.{t}) <= {e} then\nVCC.u64[laneId] = 1;\n",
               "elsif exponent(S2.{t}) <= {e} then\n"),
              ("elsif divWouldBeDenorm(S2.{t}, S1.{t}) then\nVCC.u64[laneId] = 1;\nD0.{t} = S0.{t}",
               "elsif divWouldBeDenorm(S2.{t}, S1.{t}) then\nVCC.u64[laneId] = 1;\n"
               "D0.{t} = (S0.{t} == S2.{t}) ? ldexp(S0.{t}, {x}) : S0.{t}"))


def _get_pcode(original):
    @functools.cache
    def fixed(op, on_now: bool) -> str:
        text = original(op)
        if not on_now or not op.name.startswith("V_DIV_SCALE_F32"):
            return text
        for old, new in _DIV_SCALE:
            old, new = (x.format(t="f32", e=23, x=64) for x in (old, new))
            if old not in text:
                raise RuntimeError(f"div_scale: the emulator's V_DIV_SCALE_F32 text changed; "
                                   f"expected {old!r}")
            text = text.replace(old, new)
        return text

    def get_pcode(op) -> str:
        return fixed(op, on("div_scale"))
    return get_pcode


# ---- f32 denormals ----
# COMPUTE_PGM_RSRC1.FLOAT_DENORM_MODE_32 (bits 17:16, LLVM AMDGPUUsage): 0 flushes source and
# destination denormals, 3 flushes neither (clang's default for HIP). The emulator always runs
# with x86 DAZ + FTZ, i.e. as mode 0; we set MXCSR from the kernel's own mode.
_RSRC1_DENORM_32 = (16, 0x3)


@contextlib.contextmanager
def float_mode(kernel):
    shift, mask = _RSRC1_DENORM_32
    mode = kernel.rsrc1 >> shift & mask
    before = _state["ftz"]
    _state["ftz"] = mode != 3 or not on("float_denorm")
    try:
        yield
    finally:
        _state["ftz"] = before


class _FloatMode:
    """The emulator's MXCSR context, with DAZ + FTZ only where the kernel asks for them."""
    __slots__ = ("_saved",)

    def __enter__(self):
        lib, ftz_bits = _emu._get_ftz_lib()
        if lib is not None:
            self._saved = lib.get_fpcr()
            bits = self._saved | ftz_bits if _state["ftz"] else self._saved & ~ftz_bits
            lib.set_fpcr(bits)
        return self

    def __exit__(self, *exc):
        lib, _ = _emu._get_ftz_lib()
        if lib is not None and hasattr(self, "_saved"):
            lib.set_fpcr(self._saved)


def install(emu) -> None:
    """Installs the fixes over the emulator module (once per process)."""
    global _emu
    if _emu is not None:
        return
    from test.mockgpu.amd import pcode

    _emu = emu
    _ORIGINAL_FUNCS.update({k: pcode._FUNCS[k] for k in ("f32_to_fp8", "fp8_to_f32")})
    emu._compile_wmma = _wmma(emu._compile_wmma)
    emu._compile_mfma = _mfma(emu._compile_mfma)
    emu.decode_inst = _decode(emu.decode_inst)
    mem, vop, vop3, vop3p = (emu._compile_mem_op, emu._compile_vop12, emu._compile_vop3,
                             emu._compile_vop3p)
    from tinygrad.runtime.autogen.amd.rdna3 import ins as rdna3

    emu._INST_HANDLERS.setdefault(rdna3.MUBUF, mem)     # its cache invalidations, above
    for kind, handler in list(emu._INST_HANDLERS.items()):
        if handler is mem:
            emu._INST_HANDLERS[kind] = _mem_op(mem)
        elif handler is vop:
            emu._INST_HANDLERS[kind] = _vop1(vop)
        elif handler is vop3:
            emu._INST_HANDLERS[kind] = _vop3(vop3)
        elif handler is vop3p:
            emu._INST_HANDLERS[kind] = _vop3p(vop3p)
    emu._MXCSRContext = _FloatMode
    emu.get_pcode = _get_pcode(emu.get_pcode)
    emu.run_asm, emu._init_wave = _run_asm(emu.run_asm), _init_wave(emu._init_wave)
    _flush_runners()
