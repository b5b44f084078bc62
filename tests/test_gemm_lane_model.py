"""L3: a lane-level model of each FP8 matrix instruction, driven by the kernel's index math.

Two independent statements meet here:
- the instruction's operand layout as AMD's matrix instruction calculator / ISA documents and
  NVIDIA's PTX ISA state it, written below in their own form: element (row, k) of A lives in
  lane L, byte b of the operand;
- the index expressions the portable GEMM kernel is rendered with (codegen/matrix.py): which
  row, column and K slice each lane loads, and where each accumulator register lands.
The model runs the kernel's tile loop (templates/gemm_a8w8_blockscale_mma.cu.j2, mirrored
step by step) over small matrices with tails in M, N and K, feeding each instruction what the
lanes would load and computing it as the documents define it. It must reproduce the exact
block-scaled product; a wrong lane mapping, K order, swap or store index shows as a mismatch.
"""
import re

import numpy as np
import pytest

from codegen.families import gemm as fam
from codegen.matrix import ATOMS, TARGET_ATOM, evaluate, uses
from codegen.render import render
from codegen.spec import make_variant, validate
from codegen.targets import get_target


# ---- the documents' layouts: (row, k) -> (lane, byte of the lane's operand) -------------

def doc_mfma_16x16x32_fp8():
    """CDNA3 ISA / matrix calculator, v_mfma_f32_16x16x32_fp8_fp8: A[i][k] in lane 16*(k//8)+i,
    byte k%8 of the 64-bit operand; B[k][j] likewise with j; D[i][j] in lane 16*(i//4)+j,
    register i%4."""
    a = {(i, k): (16 * (k // 8) + i, k % 8) for i in range(16) for k in range(32)}
    b = {(k, j): (16 * (k // 8) + j, k % 8) for j in range(16) for k in range(32)}
    d = {(i, j): (16 * (i // 4) + j, i % 4) for i in range(16) for j in range(16)}
    return a, b, d


def doc_mfma_32x32x16_fp8():
    """CDNA3 matrix calculator, v_mfma_f32_32x32x16_fp8_fp8: A[i][k] in lane 32*(k//8)+i, byte
    k%8 of the 64-bit operand; B[k][j] likewise with j; D[i][j] in lane 32*((i//4)%2)+j,
    register 4*(i//8)+i%4 (rows 0-3 in v0-v3 of lanes 0-31, rows 4-7 in v0-v3 of lanes 32-63,
    rows 8-11 in v4-v7 of lanes 0-31, ...)."""
    a = {(i, k): (32 * (k // 8) + i, k % 8) for i in range(32) for k in range(16)}
    b = {(k, j): (32 * (k // 8) + j, k % 8) for j in range(32) for k in range(16)}
    d = {(i, j): (32 * ((i // 4) % 2) + j, 4 * (i // 8) + i % 4)
         for i in range(32) for j in range(32)}
    return a, b, d


def doc_mfma_16x16x128_f8f6f4():
    """CDNA4, v_mfma_f32_16x16x128_f8f6f4 with FP8 A and B (cbsz = blgp = 0): lane l holds row
    l%16 of A; with g = l//16, byte j of its 32-byte operand is K = 16g + j%16 + 64(j//16)
    (the split layout Composable Kernel's hardware probe test/mx_mfma_op/scale_mapping_16x16x128
    prints); B likewise with its column; D as the 16x16 CDNA MFMAs: D[i][j] in lane 16*(i//4)+j,
    register i%4. The kernel feeds each lane 32 contiguous bytes of K instead: a permutation of
    K shared by A and B, which this model checks leaves the product unchanged."""
    def slot(k):
        g, rest = (k % 64) // 16, k % 16 + 16 * (k // 64)
        return g, rest
    a = {(i, k): (16 * slot(k)[0] + i, slot(k)[1]) for i in range(16) for k in range(128)}
    b = {(k, j): (16 * slot(k)[0] + j, slot(k)[1]) for j in range(16) for k in range(128)}
    d = {(i, j): (16 * (i // 4) + j, i % 4) for i in range(16) for j in range(16)}
    return a, b, d


def doc_mfma_32x32x64_f8f6f4():
    """CDNA4, v_mfma_f32_32x32x64_f8f6f4 with FP8 A and B (cbsz = blgp = 0): lane l holds row
    l%32 of A; with g = l//32, byte j of its 32-byte operand is K = 16g + j%16 + 32(j//16)
    (Composable Kernel's hardware probe test/mx_mfma_op/scale_mapping_32x32x64: row i's K 0-15
    and 32-47 in lane i, 16-31 and 48-63 in lane i + 32); B likewise with its column; D as the
    other 32 x 32 MFMAs: D[i][j] in lane 32*((i//4)%2)+j, register 4*(i//8)+i%4. The kernel
    feeds 32 contiguous bytes of K per lane: a permutation of K shared by A and B."""
    def slot(k):
        return (k % 32) // 16, k % 16 + 16 * (k // 32)
    a = {(i, k): (32 * slot(k)[0] + i, slot(k)[1]) for i in range(32) for k in range(64)}
    b = {(k, j): (32 * slot(k)[0] + j, slot(k)[1]) for j in range(32) for k in range(64)}
    d = {(i, j): (32 * ((i // 4) % 2) + j, 4 * (i // 8) + i % 4)
         for i in range(32) for j in range(32)}
    return a, b, d


def doc_wmma_16x16x16_fp8():
    """RDNA4 ISA / matrix calculator, v_wmma_f32_16x16x16_fp8_fp8 (wave32): A[i][k] in lane
    16*(k//8)+i, byte k%8 of the two dwords; B[k][j] likewise; D[i][j] in lane 16*(i//8)+j,
    register i%8."""
    a = {(i, k): (16 * (k // 8) + i, k % 8) for i in range(16) for k in range(16)}
    b = {(k, j): (16 * (k // 8) + j, k % 8) for j in range(16) for k in range(16)}
    d = {(i, j): (16 * (i // 8) + j, i % 8) for i in range(16) for j in range(16)}
    return a, b, d


def doc_mma_m16n8k32_e4m3():
    """PTX ISA, mma.m16n8k32 fragments (g = lane / 4, t = lane % 4): A register a_r holds rows
    g (r = 0, 2) / g + 8 (r = 1, 3) and k = 4t..4t+3 (+16 for r = 2, 3); B b0 holds k = 4t..,
    b1 k + 16, column g; C c0, c1: row g, cols 2t, 2t+1; c2, c3: row g + 8.
    Byte positions refer to the kernel's operand: arch_cuda.cuh passes a[0].x, a[1].x, a[0].y,
    a[1].y as a0..a3, so operand row j of a lane holds register a_(j + 2 * (byte // 4))."""
    a, b, d = {}, {}, {}
    for i in range(16):
        for k in range(32):
            g, t = i % 8, (k % 16) // 4
            reg = (i >= 8) + 2 * (k >= 16)
            a[(i, k)] = (4 * g + t, (reg % 2, 4 * (reg // 2) + k % 4))  # (operand row, byte)
    for j in range(8):
        for k in range(32):
            b[(k, j)] = (4 * j + (k % 16) // 4, 4 * (k >= 16) + k % 4)
    for i in range(16):
        for j in range(8):
            d[(i, j)] = (4 * (i % 8) + j // 2, 2 * (i >= 8) + j % 2)
    return a, b, d


DOCS = {"mfma_f32_16x16x32_fp8": doc_mfma_16x16x32_fp8,
        "mfma_f32_32x32x16_fp8": doc_mfma_32x32x16_fp8,
        "mfma_f32_16x16x128_f8f6f4": doc_mfma_16x16x128_f8f6f4,
        "mfma_f32_32x32x64_f8f6f4": doc_mfma_32x32x64_f8f6f4,
        "wmma_f32_16x16x16_fp8": doc_wmma_16x16x16_fp8,
        "mma_m16n8k32_e4m3": doc_mma_m16n8k32_e4m3}


def instruction(atom, a_ops, b_ops):
    """D = A @ B per the document, from the lanes' operands: a_ops[lane][j] and b_ops[lane]
    are lane_bytes-value vectors (j: the operand rows a lane feeds)."""
    doc_a, doc_b, doc_d = DOCS[atom.name]()
    A = np.zeros((atom.rows, atom.k))
    B = np.zeros((atom.k, atom.cols))
    for (i, k), (lane, pos) in doc_a.items():
        j, byte = pos if isinstance(pos, tuple) else (0, pos)
        A[i, k] = a_ops[lane][j][byte]
    for (k, j), (lane, byte) in doc_b.items():
        B[k, j] = b_ops[lane][byte]
    D = A @ B
    regs = np.zeros((atom.wave, len(atom.c)))
    for (i, j), (lane, r) in doc_d.items():
        regs[lane, r] = D[i, j]
    return regs


# ---- the kernel's tile loop, as the template writes it -----------------------------------


def issue_pair(atom, acc, lanes):
    """The instructions fed by one chunk per operand row (two of 8 bytes from a 16-byte load,
    low half first, or one of 32 bytes), added into acc in that order; lanes[lane] = (that
    lane's A rows, its B column), atom.chunk values each."""
    for i in range(atom.per_chunk):
        part = slice(i * atom.lane_bytes, (i + 1) * atom.lane_bytes)
        acc += instruction(atom, [[r[part] for r in rows] for rows, _ in lanes],
                           [col[part] for _, col in lanes])

def run_kernel_model(atom, bm, bn, split_k, A, As, B, Bs):
    arch = next(a for a, name in TARGET_ATOM.items() if name == atom.name)
    v = make_variant(fam.FAMILY, arch, fp8=get_target(arch).fp8_formats[0].token,
                     **fam.config("mma", bm, bn, split_k=split_k))
    assert validate(v) is None, validate(v)
    fr, fc = fam.mma_frags(v, atom)
    swap = fam.swapped(v)
    m, k = A.shape
    n = B.shape[0]
    rsrc, csrc = (B, A) if swap else (A, B)
    nr, nc = (n, m) if swap else (m, n)
    tile_r, tile_c = fr * atom.rows, fc * atom.cols
    tiles_r = -(-nr // tile_r)
    out = np.full((m, n), np.nan)
    kblocks = -(-k // 128)
    ev = evaluate
    for block in range(tiles_r * -(-nc // tile_c)):
        r0, c0 = (block % tiles_r) * tile_r, (block // tiles_r) * tile_c
        bs_row = (r0 if swap else c0) // 128
        total = np.zeros((atom.wave, fr, fc, len(atom.c)))
        for wave in range(split_k):
            acc = np.zeros((atom.wave, fr, fc, len(atom.c)))
            for kb in range(wave, kblocks, split_k):
                part = np.zeros_like(acc)
                for p in range(128 // atom.pair_k):
                    kk = kb * 128 + p * atom.pair_k

                    def load(src, rows_total, row, kgroup):
                        row = min(row, rows_total - 1)
                        start = kk + kgroup * 16
                        chunk = np.zeros(16)
                        if start < k:      # the kernel loads 16 bytes or zeros (k % 16 == 0)
                            chunk[:] = src[row, start:start + 16]
                        return chunk

                    for f in range(fr):
                        for g in range(fc):
                            lanes = []
                            for lane in range(atom.wave):
                                rows = [load(rsrc, nr, r0 + f * atom.rows + ev(e, lane),
                                             ev(atom.a_kgroup, lane)) for e in atom.a_rows]
                                col = load(csrc, nc, c0 + g * atom.cols + ev(atom.b_col, lane),
                                           ev(atom.b_kgroup, lane))
                                lanes.append((rows, col))
                            issue_pair(atom, part[:, f, g], lanes)
                sb = Bs[bs_row, kb]
                for lane in range(atom.wave):
                    for f in range(fr):
                        for g in range(fc):
                            for i, (cr, cc) in enumerate(atom.c):
                                token = (c0 + g * atom.cols + ev(cc, lane) if swap
                                         else r0 + f * atom.rows + ev(cr, lane))
                                sa = As[min(token, m - 1), kb]
                                acc[lane, f, g, i] += part[lane, f, g, i] * (sa * sb)
            total += acc
        for lane in range(atom.wave):
            for f in range(fr):
                for g in range(fc):
                    for i, (cr, cc) in enumerate(atom.c):
                        row = r0 + f * atom.rows + ev(cr, lane)
                        col = c0 + g * atom.cols + ev(cc, lane)
                        mi, ni = (col, row) if swap else (row, col)
                        if mi < m and ni < n:
                            assert np.isnan(out[mi, ni]), f"({mi}, {ni}) stored twice"
                            out[mi, ni] = total[lane, f, g, i]
    return out


def run_lds_kernel_model(arch, atom_value, atom, bm, bn, A, As, B, Bs, wave_tile=""):
    """templates/gemm_a8w8_blockscale_lds.cu.j2, step by step: each K block of the block's A and
    B rows is staged (rows clamped, bytes past k zero), then every wave feeds its instructions
    from the stage."""
    v = make_variant(fam.FAMILY, arch, fp8=get_target(arch).fp8_formats[0].token,
                     **fam.config("lds", bm, bn, stages=2, atom=atom_value, wave_tile=wave_tile))
    assert validate(v) is None, validate(v)
    wm, wn = fam.lds_waves(v)
    tm, tn = bm // wm, bn // wn
    fr, fc = tm // atom.rows, tn // atom.cols
    m, k = A.shape
    n = B.shape[0]
    out = np.full((m, n), np.nan)
    kblocks = -(-k // 128)
    ev = evaluate
    tiles_m = -(-m // bm)
    for block in range(tiles_m * -(-n // bn)):
        m0, n0 = (block % tiles_m) * bm, (block // tiles_m) * bn
        for wave in range(wm * wn):
            wm0, wn0 = (wave % wm) * tm, (wave // wm) * tn
            acc = np.zeros((atom.wave, fr, fc, len(atom.c)))
            for kb in range(kblocks):
                stage = np.zeros((bm + bn, 128))
                for row in range(bm + bn):
                    src = A[min(m0 + row, m - 1)] if row < bm else B[min(n0 + row - bm, n - 1)]
                    for piece in range(8):
                        start = kb * 128 + piece * 16
                        if start < k:
                            stage[row, piece * 16:piece * 16 + 16] = src[start:start + 16]
                part = np.zeros_like(acc)
                for p in range(128 // atom.pair_k):
                    for f in range(fr):
                        for g in range(fc):
                            lanes = []
                            for lane in range(atom.wave):
                                w = atom.chunk
                                kr = p * atom.pair_k + ev(atom.a_kgroup, lane) * w
                                kc = p * atom.pair_k + ev(atom.b_kgroup, lane) * w
                                rows = [stage[wm0 + f * atom.rows + ev(e, lane), kr:kr + w]
                                        for e in atom.a_rows]
                                col = stage[bm + wn0 + g * atom.cols + ev(atom.b_col, lane),
                                            kc:kc + w]
                                lanes.append((rows, col))
                            issue_pair(atom, part[:, f, g], lanes)
                sb = Bs[n0 // 128, kb]
                for lane in range(atom.wave):
                    for f in range(fr):
                        for i, (cr, _) in enumerate(atom.c):
                            sa = As[min(m0 + wm0 + f * atom.rows + ev(cr, lane), m - 1), kb]
                            acc[lane, f, :, i] += part[lane, f, :, i] * (sa * sb)
            for lane in range(atom.wave):
                for f in range(fr):
                    for g in range(fc):
                        for i, (cr, cc) in enumerate(atom.c):
                            row = m0 + wm0 + f * atom.rows + ev(cr, lane)
                            col = n0 + wn0 + g * atom.cols + ev(cc, lane)
                            if row < m and col < n:
                                assert np.isnan(out[row, col]), f"({row}, {col}) stored twice"
                                out[row, col] = acc[lane, f, g, i]
    return out


def reference(A, As, B, Bs):
    m, k = A.shape
    cols = np.arange(k) // 128
    return (A * As[:, cols]) @ (B * Bs[np.arange(B.shape[0]) // 128][:, cols]).T


CONFIGS = {  # (block_m, block_n, split_k): both orientations, several fragments, split K
    "mfma_f32_16x16x32_fp8": [(16, 16, 1), (16, 32, 2), (32, 16, 1)],
    "wmma_f32_16x16x16_fp8": [(16, 16, 2), (32, 16, 1), (16, 32, 1)],
    "mma_m16n8k32_e4m3": [(8, 16, 2), (16, 16, 1), (32, 16, 1)],
}


MMA_ATOMS = sorted({atom.name for _, kernel, _, atom in uses() if kernel == "mma"})
# one target per distinct lds-kernel instruction form
LDS_FORMS = sorted({(atom.name, value): (arch, value) for arch, kernel, value, atom in uses()
                    if kernel == "lds"}.values())


@pytest.mark.parametrize("name", MMA_ATOMS)
def test_lane_model_reproduces_block_scaled_gemm(name):
    atom = ATOMS[name]
    rng = np.random.default_rng(0)
    m, n, k = 19, 40, 272          # tails everywhere: K = 2 blocks + 16
    A = rng.integers(-8, 9, (m, k)).astype(float)      # small integers: every sum is exact
    B = rng.integers(-8, 9, (n, k)).astype(float)
    As = 2.0 ** rng.integers(-3, 4, (m, -(-k // 128)))
    Bs = 2.0 ** rng.integers(-3, 4, (-(-n // 128), -(-k // 128)))
    want = reference(A, As, B, Bs)
    for bm, bn, sk in CONFIGS[name]:
        got = run_kernel_model(atom, bm, bn, sk, A, As, B, Bs)
        assert not np.isnan(got).any(), f"{name} {bm}x{bn}: elements never stored"
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {bm}x{bn} sk{sk}")


@pytest.mark.parametrize("arch,atom_value", LDS_FORMS)
def test_lane_model_of_the_lds_kernel(arch, atom_value):
    """The LDS-staged kernel: several waves per block, tails in M, N and K, two N blocks of
    weight scales."""
    from codegen.matrix import atom_for

    atom = atom_for(arch, "lds", atom_value)
    name = f"{arch} {atom.name}"
    rng = np.random.default_rng(1)
    m, n, k = 37, 150, 272
    A = rng.integers(-8, 9, (m, k)).astype(float)
    B = rng.integers(-8, 9, (n, k)).astype(float)
    As = 2.0 ** rng.integers(-3, 4, (m, -(-k // 128)))
    Bs = 2.0 ** rng.integers(-3, 4, (-(-n // 128), -(-k // 128)))
    want = reference(A, As, B, Bs)
    got = run_lds_kernel_model(arch, atom_value, atom, 64, 64, A, As, B, Bs)
    assert not np.isnan(got).any(), f"{name}: elements never stored"
    np.testing.assert_array_equal(got, want, err_msg=name)
    if get_target(arch).wave_size == 64:   # the 64 x 32 wave tile: 2 x 2 waves of 64 x 32
        got = run_lds_kernel_model(arch, atom_value, atom, 128, 64, A, As, B, Bs, "w64x32")
        assert not np.isnan(got).any(), f"{name} w64x32: elements never stored"
        np.testing.assert_array_equal(got, want, err_msg=f"{name} w64x32")
    if get_target(arch).wave_size == 64 and atom.rows == 16:   # 2 x 2 waves of 64 x 64
        got = run_lds_kernel_model(arch, atom_value, atom, 128, 128, A, As, B, Bs, "w64x64")
        assert not np.isnan(got).any(), f"{name} w64x64: elements never stored"
        np.testing.assert_array_equal(got, want, err_msg=f"{name} w64x64")


@pytest.mark.parametrize("arch,atom_value", [f for f in LDS_FORMS if f[0].startswith("gfx")])
def test_lds_stage_accesses_spread_over_the_banks(arch, atom_value):
    """Every 16-byte LDS access of the lds kernel (A and B fragment reads, staging writes), in
    groups of 8 neighbouring lanes (128 bytes, one pass over 32 four-byte banks): the 8 pieces
    land in 8 distinct groups of 4 banks through the stage layout (fam.lds_stage_offset). Rows
    stored plainly, 128 bytes apart, would put the rows neighbouring lanes read in one group."""
    from codegen.matrix import atom_for

    atom = atom_for(arch, "lds", atom_value)
    rows, kgroups = (atom.a_rows[0], atom.b_col), (atom.a_kgroup, atom.b_kgroup)

    def spread(offsets):
        return all(len({o // 16 % 8 for o in offsets[i:i + 8]}) == 8
                   for i in range(0, len(offsets), 8))

    def accesses(layout):
        out = [[layout(c // 8, c % 8 * 16) for c in range(256)]]          # staging writes
        for p in range(128 // atom.pair_k):
            for piece in range(atom.chunk // 16):
                for row, kgroup in zip(rows, kgroups):
                    out.append([layout(64 + evaluate(row, lane),
                                       p * atom.pair_k + evaluate(kgroup, lane) * atom.chunk +
                                       16 * piece) for lane in range(atom.wave)])
        return out

    assert all(spread(a) for a in accesses(fam.lds_stage_offset))
    assert not all(spread(a) for a in accesses(lambda row, col: row * 128 + col))
    # fam.lds_stage_offset is the rendered kernel's `at`: its column expression, evaluated
    v = make_variant(fam.FAMILY, arch, fp8=get_target(arch).fp8_formats[0].token,
                     **fam.config("lds", 64, 64, stages=2, atom=atom_value))
    at = re.search(r"auto at = \[&\]\(int buf, int row, int col\) \{ return "
                   r"&stage\[buf\]\[row\]\[(.*)\]; \};", render(v))
    assert at, "the lds kernel's stage layout (its `at` lambda) was not found"
    column = compile(at.group(1), "at", "eval")      # ^, &, << mean the same in Python
    assert all(fam.lds_stage_offset(row, col) == row * 128 + eval(column, {"row": row, "col": col})
               for row in range(256) for col in range(128))


@pytest.mark.parametrize("name", sorted(ATOMS))
def test_accumulator_offsets_are_the_same_in_every_lane(name):
    """The lds kernel stores accumulator i of every lane at one lane address (accumulator 0's)
    plus a row and column offset that it takes to be uniform."""
    atom = ATOMS[name]
    for cr, cc in atom.c:
        offsets = {(evaluate(cr, lane) - evaluate(atom.c[0][0], lane),
                    evaluate(cc, lane) - evaluate(atom.c[0][1], lane))
                   for lane in range(atom.wave)}
        assert len(offsets) == 1, (cr, cc, offsets)


@pytest.mark.parametrize("name", sorted(ATOMS))
def test_documented_layouts_are_bijections(name):
    """Each document's layout puts every element in exactly one (lane, slot)."""
    atom = ATOMS[name]
    for layout in DOCS[name]():
        slots = list(layout.values())
        assert len(set(slots)) == len(slots)
    assert atom.k == atom.lane_bytes * atom.kgroups


@pytest.mark.parametrize("arch,kernel,atom_value", sorted(
    {(arch, kernel, value) for arch, kernel, value, _ in uses()}))
def test_kernel_source_uses_the_modelled_expressions(arch, kernel, atom_value):
    """The rendered kernel carries the very expressions the model evaluated, each in its role:
    the lane functions of templates/gemm_atom.inc.j2 return them, case by case in order."""
    from codegen.matrix import atom_for

    atom = atom_for(arch, kernel, atom_value)
    v = make_variant(fam.FAMILY, arch, fp8=get_target(arch).fp8_formats[0].token,
                     **fam.config(kernel, 64 if kernel == "lds" else 16, 64 if kernel == "lds"
                                  else 16, stages=2 if kernel == "lds" else 1, atom=atom_value))
    assert validate(v) is None, validate(v)
    src = render(v)

    def returned(fn: str) -> list[str]:
        """What the lane function fn returns: its one expression, or its cases in order."""
        body = re.search(rf"int {fn}\(int lane(?:, int \w)?\) \{{(.*?)\n?\}}\n", src, re.S)
        assert body, (arch, fn)
        cases = re.findall(r"if \(\w == (\d+)\) return (.*?);", body.group(1))
        if not cases:
            return [re.fullmatch(r" return (.*); ", body.group(1)).group(1)]
        assert [int(i) for i, _ in cases] == list(range(len(cases))), (arch, fn)
        return [e for _, e in cases]
    assert returned("a_row") == list(atom.a_rows)
    assert returned("a_kgroup") == [atom.a_kgroup]
    assert returned("b_col") == [atom.b_col]
    assert returned("b_kgroup") == [atom.b_kgroup]
    assert returned("c_row") == [r for r, _ in atom.c]
    assert returned("c_col") == [c for _, c in atom.c]
    assert f"cg::{atom.name}(" in src


# ---- the decode kernel (no matrix instruction): which lane sums which 16-byte piece ----------

GEMV_EXPRESSIONS = (   # templates/gemm_a8w8_blockscale_gemv.cu.j2, as the model below runs them
    "const int local_row = wave / SPLIT, slice = wave % SPLIT;",
    "const int row = cg::block_x() * ROWS + local_row;",
    "const int m0 = cg::block_y() * MR;",
    "const int pieces = k / 16, step = SPLIT * WAVE;",
    "for (int p0 = slice * WAVE + lane; p0 < pieces; p0 += step * UNROLL) {",
    "const int p = imin(p0 + u * step, pieces - 1), kb = p / PIECES_PER_KBLOCK;",
    "if (p0 + u * step >= pieces) break;",
    "if (m0 + i < m) out[int64_t(m0 + i) * n + row]",
)


def run_gemv_model(wave, mr, rows, split, A, As, B, Bs):
    """The gemv kernel's loops, lane by lane: each lane's pieces, its sums, the wave and slice
    reductions, the stores (NaN where nothing is stored)."""
    m, k = A.shape
    n = B.shape[0]
    unroll, pieces, step = fam.GEMV_UNROLL, k // 16, split * wave
    out = np.full((m, n), np.nan)
    for bx in range(-(-n // rows)):
        for by in range(-(-m // mr)):
            m0 = by * mr
            for local_row in range(rows):
                row = bx * rows + local_row
                brow = min(row, n - 1)
                total = np.zeros(mr)
                for slice_ in range(split):
                    for lane in range(wave):
                        acc = np.zeros(mr)
                        for p0 in range(slice_ * wave + lane, pieces, step * unroll):
                            for u in range(unroll):
                                if p0 + u * step >= pieces:
                                    break
                                p = min(p0 + u * step, pieces - 1)
                                kb = p // 8
                                for i in range(mr):
                                    if m0 + i >= m:
                                        break
                                    d = A[m0 + i, 16 * p:16 * p + 16] @ B[brow, 16 * p:16 * p + 16]
                                    acc[i] += d * As[m0 + i, kb] * Bs[brow // 128, kb]
                        total += acc          # the butterfly, then the slices in shared memory
                if row < n:
                    for i in range(mr):
                        if m0 + i < m:
                            out[m0 + i, row] = total[i]
    return out


@pytest.mark.parametrize("wave", [32, 64])
def test_lane_model_of_the_gemv_kernel(wave):
    """Every 16-byte piece of K counted once per (row of A, row of B): tails in M (grid y), N
    (rows per block), K (pieces not a multiple of the lanes), two weight-scale blocks in N."""
    rng = np.random.default_rng(1)
    m, n, k = 5, 133, 2064         # 129 pieces: a tail past 2 x 64 lanes
    A = rng.integers(-8, 9, (m, k)).astype(float)
    B = rng.integers(-8, 9, (n, k)).astype(float)
    As = 2.0 ** rng.integers(-3, 4, (m, -(-k // 128)))
    Bs = 2.0 ** rng.integers(-3, 4, (-(-n // 128), -(-k // 128)))
    want = reference(A, As, B, Bs)
    for mr, rows, split in [(1, 2, 1), (2, 1, 2), (4, 4, 1), (1, 8, 4)]:
        got = run_gemv_model(wave, mr, rows, split, A, As, B, Bs)
        np.testing.assert_array_equal(got, want, err_msg=f"gemv {mr}x{rows} sk{split}")


@pytest.mark.parametrize("arch", ["sm_90a", "gfx942", "gfx1201"])
def test_gemv_source_uses_the_modelled_expressions(arch):
    v = make_variant(fam.FAMILY, arch, fp8=get_target(arch).fp8_formats[0].token,
                     **fam.config("gemv", 2, 2, split_k=2))
    assert validate(v) is None, validate(v)
    src = render(v)
    for expr in GEMV_EXPRESSIONS:
        assert expr in src, (arch, expr)
    assert f"constexpr int UNROLL = {fam.GEMV_UNROLL};" in src
