"""JIT cache: concurrent cold builds build once; a killed build leaves nothing loadable."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.isa   # uses the offline gfx toolchain, so it runs on CPU-only CI

PARAMS = "dtype='bf16', group_size=64, fp8='e4m3fn448', scale_layout='col', ue8m0=True"
SNIPPET = f"""
import sys
from codegen.spec import make_variant
import codegen.build.jit as jit
v = make_variant('group_quant_fp8', 'gfx1201', {PARAMS})
p = jit.compile_variant(v)
print(p, jit.BUILDS)
"""


def _spawn(env):
    return subprocess.Popen([sys.executable, "-c", SNIPPET], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_eight_processes_cold_cache_build_once(cache_dir):
    env = dict(os.environ, CODEGEN_CACHE_DIR=str(cache_dir))
    procs = [_spawn(env) for _ in range(8)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    paths = {r[0].split()[0] for r in results}
    builds = sum(int(r[0].split()[1]) for r in results)
    assert len(paths) == 1 and builds == 1
    d = Path(paths.pop())
    assert (d / "group_quant_fp8_bf16_g64_e4m3fn448_col_ue8m0.s").exists()
    assert not list(d.parent.glob(".staging-*"))


def test_killed_build_leaves_nothing_loadable(cache_dir):
    env = dict(os.environ, CODEGEN_CACHE_DIR=str(cache_dir))
    p = _spawn(env)
    base = cache_dir / "gfx1201" / "group_quant_fp8_bf16_g64_e4m3fn448_col_ue8m0"
    deadline = time.time() + 60
    while time.time() < deadline and not list(base.glob(".staging-*")):
        time.sleep(0.01)
    assert list(base.glob(".staging-*")), "build never started"
    p.send_signal(signal.SIGKILL)
    p.wait()
    published = [d for d in base.iterdir() if not d.name.startswith((".", "failed"))]
    assert published == []          # only a staging dir is left, and nothing reads it
    q = _spawn(env)                  # the next run builds it properly (lock released by the OS)
    out, err = q.communicate(timeout=300)
    assert q.returncode == 0, err
    assert Path(out.split()[0]).is_dir() and out.split()[1] == "1"
