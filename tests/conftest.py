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
    for item in items:
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
