import os
import shutil

import pytest


def _has_offline_amd_toolchain() -> bool:
    from codegen import knobs
    from codegen.toolchain import hip_headers_from_triton

    return bool(shutil.which(knobs.clang()) and hip_headers_from_triton()) or bool(
        knobs.rocm_path())


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    require_isa = os.environ.get("CODEGEN_REQUIRE_ISA") == "1"
    no_isa = not _has_offline_amd_toolchain()
    no_gpu = not _has_gpu()
    no_emu = None
    if any("emu" in item.keywords for item in items):
        from codegen.emu import unavailable_reason

        no_emu = unavailable_reason()
    for item in items:
        if "emu" in item.keywords and no_emu:
            item.add_marker(pytest.mark.skip(reason=f"AMD emulator: {no_emu}"))
        if "isa" in item.keywords and no_isa:
            if require_isa:
                pytest.exit("CODEGEN_REQUIRE_ISA=1 but the offline AMD toolchain (clang-22, "
                            "lld-22, triton's HIP headers) is missing", returncode=1)
            item.add_marker(pytest.mark.skip(reason="offline AMD toolchain not installed"))
        if "gpu" in item.keywords and no_gpu:
            item.add_marker(pytest.mark.skip(reason="no GPU"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(d))
    return d



# ---- the emulator tier's summary: arch x family, variants executed, cases, result, time ----
_EMU_FAMILIES = (("test_emu_gap", "emulator gaps"), ("test_emu_quant", "group_quant_fp8"),
                 ("test_emu_rmsnorm_group_quant", "rmsnorm_group_quant"),
                 ("test_emu_dual", "dual_rmsnorm_group_quant"), ("test_emu_rmsnorm", "rmsnorm"),
                 ("test_emu_gemm", "gemm_a8w8_blockscale"), ("test_emu_aiter", "codegen.aiter"),
                 ("test_emu_vllm", "codegen.vllm"),
                 ("test_emu_modules", "codegen.nn"), ("test_emu_buffers", "emulator buffers"))
_EMU_CONTRACT = {"emulator gaps": "each fix shown", "group_quant_fp8": "bit-exact",
                 "rmsnorm": "fused = unfused, <= 1 ulp",
                 "rmsnorm_group_quant": "bit-exact vs unfused",
                 "dual_rmsnorm_group_quant": "bit-exact vs single ops",
                 "gemm_a8w8_blockscale": "rel. error < 1e-3, by row",
                 "codegen.aiter": "bit-exact vs the ops",
                 "codegen.vllm": "bit-exact vs the ops",
                 "codegen.nn": "bit-exact vs the ops",
                 "emulator buffers": "between guard pages"}
# rows counting every variant they ran
_EMU_ANY_FAMILY = ("emulator gaps", "codegen.aiter", "codegen.vllm", "codegen.nn")
_emu_reports: dict[str, object] = {}


def pytest_runtest_logreport(report):
    if "test_emu.py::" in report.nodeid and (report.when == "call" or report.outcome != "passed"):
        _emu_reports[report.nodeid] = report


def pytest_terminal_summary(terminalreporter):
    reports = [r for r in _emu_reports.values() if not r.skipped]
    if not reports:
        return
    from codegen.spec import families
    from tests import test_emu

    def family_of(uri: str) -> str:
        return max((f for f in families() if uri.startswith(f)), key=len, default="")
    rows: dict[tuple, dict] = {}
    for r in reports:
        name, _, params = r.nodeid.split("::")[1].partition("[")
        arch = next((a for a in ("gfx942", "gfx950", "gfx1200", "gfx1201", "gfx1100", "gfx90a")
                     if a in params or a in name), "-")
        family = next(f for prefix, f in _EMU_FAMILIES if name.startswith(prefix))
        row = rows.setdefault((arch, family), dict(variants=set(), cases=0, failed=0, time=0.0))
        row["cases"] += 1
        row["failed"] += r.failed
        row["time"] += r.duration
        row["variants"] |= {u for u in test_emu.EXECUTED.get(r.nodeid, ())
                            if family in _EMU_ANY_FAMILY or family == family_of(u)}
    tr = terminalreporter
    tr.section("AMD emulator (L4): what executed where")
    tr.write_line(f"{'arch':<8} {'family':<26} {'variants':>8} {'cases':>6} {'result':<28} "
                  f"{'s':>6}")
    for (arch, family), row in sorted(rows.items()):
        result = f"{row['failed']} failed" if row["failed"] else _EMU_CONTRACT[family]
        tr.write_line(f"{arch:<8} {family:<26} {len(row['variants']):>8} {row['cases']:>6} "
                      f"{result:<28} {row['time']:>6.1f}")
    from codegen.reference import GEMM_ROW_TOL
    from tests.checks import MEASURED
    if "gemm_row_excess" in MEASURED:
        tr.write_line(f"GEMM: largest error past a bf16 ulp, of its row's mean |ref|: "
                      f"{MEASURED['gemm_row_excess']:.2g} (bound {GEMM_ROW_TOL:.2g})")
