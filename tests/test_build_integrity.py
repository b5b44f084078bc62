"""The JIT cache and generated/ under faults: nothing damaged is reused, nothing recorded is lost,
causes are named. A stand-in compiler (a shell script) makes the builds fast and the faults
easy to inject; the concurrency and SIGKILL guarantees with the real compiler are test_jit.py's.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import codegen.build.aot as aot
import codegen.build.jit as jit
from codegen import paths
from codegen.build import store
from codegen.build.ninja import PCH, write_if_different
from codegen.spec import make_variant
from codegen.targets import get_target
from codegen.toolchain import Toolchain

ROOT = Path(__file__).resolve().parent.parent
V = dict(dtype="bf16", group_size=128, fp8="e4m3fn448", scale_layout="row", ue8m0=False)
FAKE_CC = r"""#!/bin/sh
# stand-in compiler: -o OUT ... IN; writes fake assembly, or a real tiny .so for *.so
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
eval "in=\${$#}"
[ -n "$FAKE_CC_LOG" ] && echo "$out" >> "$FAKE_CC_LOG"
if [ -n "$FAKE_CC_SLEEP" ]; then echo $$ > "$FAKE_CC_PIDFILE"; exec sleep "$FAKE_CC_SLEEP"; fi
if [ "$FAKE_CC_FAIL" = enospc ]; then
  echo partial > "$out"; echo "fatal error: No space left on device" >&2; exit 1
fi
case "$out" in
  *.so) sym=$(grep -o 'cg_[A-Za-z0-9_]*' "$in" 2>/dev/null | head -n 1)
        [ -n "$sym" ] || sym=cg_stub
        echo "int $sym(void) { return 0; }" | cc -shared -fPIC -x c - -o "$out" ;;
  *) meta="amdhsa.kernels:"; [ -n "$FAKE_CC_NO_METADATA" ] && meta=""
     printf 'fake assembly of %s\n  .vgpr_count: 10\n  .sgpr_count: 12\n  .wavefront_size: 64\n---\n%s\n' "$in" "$meta" > "$out" ;;
esac
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A stand-in toolchain (in a path with '$' and a space) and an empty cache."""
    tools = tmp_path / "to$ols dir"
    (tools / "hip" / "include" / "hip").mkdir(parents=True)
    (tools / "hip" / "include" / "hip" / "hip_runtime.h").write_text("// v1\n")
    (tools / "hip" / "lib").mkdir()
    (tools / "hip" / "lib" / "ockl.bc").write_bytes(b"BC fake device library")
    cc = tools / "cc"
    cc.write_text(FAKE_CC)
    cc.chmod(0o755)
    log = tmp_path / "compiles.log"
    cache = tmp_path / "ca$he dir"
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(cache))
    monkeypatch.setenv("FAKE_CC_LOG", str(log))
    monkeypatch.delenv("CODEGEN_JOBS", raising=False)
    hip = Toolchain("clang", str(cc), "fake 1", (
        "-x", "hip", "--offload-arch=gfx950", "-nogpulib", "--cuda-device-only", "-O3",
        f"--rocm-path={tools / 'hip'}"), False)
    nv = Toolchain("nvcc", str(cc), "fake 1", ("-O3",), True)
    pick = lambda target: nv if target.vendor == "nvidia" else hip   # noqa: E731
    monkeypatch.setattr(jit, "find", pick)
    monkeypatch.setattr(aot, "find", pick)
    jit._verified.clear()

    class Fake:
        path, tools_dir, cache_dir, hip_tc = cc, tools, cache, hip

        @staticmethod
        def compiles() -> list[str]:
            return log.read_text().split() if log.exists() else []
    return Fake


def quant(arch="gfx950", **kw):
    return make_variant("group_quant_fp8", arch, **{**V, **kw})


def asm_of(d: Path, v) -> Path:
    return d / f"{v.uri}.s"


# ---- 1. damaged artifacts ----

@pytest.mark.parametrize("damage", ["truncate", "garble", "delete", "empty_dir"])
def test_damaged_cache_entry_is_rebuilt_once(fake, damage, capfd):
    v = quant()
    d = jit.compile_variant(v)
    good = asm_of(d, v).read_bytes()
    if damage == "truncate":
        asm_of(d, v).write_bytes(good[:10])
    elif damage == "garble":
        asm_of(d, v).write_bytes(good[::-1])
    elif damage == "delete":
        asm_of(d, v).unlink()
    else:
        for p in d.iterdir():
            p.unlink()
    jit._verified.clear()                       # a new process
    builds = jit.BUILDS
    assert jit.compile_variant(v) == d
    assert jit.BUILDS == builds + 1 and asm_of(d, v).read_bytes() == good
    err = capfd.readouterr().err
    assert err.count("is damaged") == 1 and v.uri in err
    jit._verified.clear()
    jit.compile_variant(v)
    assert jit.BUILDS == builds + 1             # intact now: no second rebuild


def test_a_whole_cache_entry_is_used_without_the_lock(fake, monkeypatch):
    """A published, intact module is found without taking the build lock, so a cache baked
    into an image or mounted read-only serves; the lock is for building only."""
    v = quant()
    d = jit.compile_variant(v)
    jit._verified.clear()                       # a new process

    def no_lock(*args):
        raise AssertionError("took the build lock to read a whole entry")
    monkeypatch.setattr(store, "locked", no_lock)
    assert jit.compile_variant(v) == d


def test_no_home_and_no_passwd_entry(fake, monkeypatch):
    """Containers run under a user id without a home: the folders fall back to a per-user temp
    folder instead of failing every lookup."""
    from codegen import knobs

    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("CODEGEN_CACHE_DIR")
    assert knobs.cache_dir().is_relative_to(knobs.home())
    monkeypatch.setattr(paths, "CHECKOUT", None)
    monkeypatch.delenv("CODEGEN_AOT_DIR", raising=False)
    assert paths.aot_dir().is_relative_to(knobs.home())


def test_a_damaged_manifest_or_a_lost_log_is_rebuilt(fake, tmp_path, capfd):
    out = tmp_path / "gen"
    target = get_target("sm_90a")
    aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    d = out / "sm_90a"
    (d / "manifest.json").write_text("[1]")
    (next(d.glob("*.so.log"))).unlink()
    manifest = aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    assert "is damaged" in capfd.readouterr().err
    assert all(r["status"] == "ok" for r in manifest["variants"])
    assert json.loads((d / "manifest.json").read_text())["arch"] == "sm_90a"
    assert all(p.with_name(p.name + ".log").exists() for p in d.glob("*.so"))


def test_truncated_module_is_rebuilt_not_loaded(fake):
    from codegen import dispatch

    v = make_variant("group_quant_fp8", "sm_90a", **V)
    so = jit.module_path(v)
    size = so.stat().st_size
    so.write_bytes(so.read_bytes()[:100])
    jit._verified.clear()
    dispatch._loaded.pop(v, None)
    assert dispatch.kernel(v) is not None       # built again, then loaded
    assert so.stat().st_size == size


def test_generated_module_that_changed_is_not_loaded(fake, tmp_path, monkeypatch, capfd):
    v = make_variant("group_quant_fp8", "sm_90a", **V)
    out = tmp_path / "gen"
    aot.build(get_target("sm_90a"), ops=["group_quant_fp8"], out_dir=out)
    monkeypatch.setenv("CODEGEN_AOT_DIR", str(out))
    so = out / "sm_90a" / f"{v.uri}.so"
    assert jit.module_path(v) == so
    good = so.read_bytes()
    so.write_bytes(good[:100])                  # its .key still names the right cache key
    assert jit.module_path(v) != so and "differs from what was built" in capfd.readouterr().err
    n = len(fake.compiles())
    aot.build(get_target("sm_90a"), ops=["group_quant_fp8"], out_dir=out)
    assert so.read_bytes() == good and len(fake.compiles()) == n + 1


def test_truncated_asm_without_key_is_rebuilt_and_its_resources_read(fake, tmp_path):
    out = tmp_path / "gen"
    target = get_target("gfx950")
    aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    v = quant()
    s = out / "gfx950" / f"{v.uri}.s"
    s.write_text("trunc")
    (out / "gfx950" / f"{v.uri}.s.key").unlink()
    n = len(fake.compiles())
    manifest = aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    assert len(fake.compiles()) == n + 1
    row = next(r for r in manifest["variants"] if r["uri"] == v.uri)
    assert row["status"] == "ok" and row["vgpr_count"] == 10


# ---- 2. what build.py records ----

def test_emulator_outputs_are_recorded_in_the_manifest(fake, tmp_path):
    """build.py --emu: each gfx variant's code object and CPU launcher, keyed and listed."""
    out, target = tmp_path / "gen", get_target("gfx950")
    manifest = aot.build(target, ops=["group_quant_fp8"], out_dir=out, emu=True)
    row = next(r for r in manifest["variants"] if r["uri"] == quant().uri)
    assert row["code_object"] == f"{quant().uri}.co"
    assert row["emu_launcher"] == f"{quant().uri}.host.so"
    assert row["asm"] == f"{quant().uri}.s" and row["status"] == "ok"
    for name in (row["code_object"], row["emu_launcher"]):
        key, size, _, _ = jit.read_key(out / "gfx950" / f"{name}.key")
        assert key != jit.read_key(out / "gfx950" / f"{row['asm']}.key")[0]   # their own key
        assert size == (out / "gfx950" / name).stat().st_size
    n = len(fake.compiles())
    aot.build(target, ops=["group_quant_fp8"], out_dir=out, emu=True)
    assert len(fake.compiles()) == n                                          # nothing to do


def test_sass_of_each_sm90a_variant_with_asm(fake, tmp_path, monkeypatch):
    """build.py --asm on sm_90a: each variant's SASS beside its module, keyed and listed; a
    second run has nothing to do, and no disassembler is a named error before any compile."""
    dis = fake.tools_dir / "cuobjdump"
    dis.write_text('#!/bin/sh\n[ "$1" = -sass ] && echo "SASS of $(cat "$2")"\n')
    dis.chmod(0o755)
    monkeypatch.setattr(aot, "cuobjdump", lambda tc: str(dis))
    out, target, v = tmp_path / "gen", get_target("sm_90a"), quant("sm_90a")
    manifest = aot.build(target, ops=["group_quant_fp8"], out_dir=out, asm=True)
    row = next(r for r in manifest["variants"] if r["uri"] == v.uri)
    assert row["status"] == "ok" and row["sass"] == f"{v.uri}.sass"
    sass = out / "sm_90a" / row["sass"]
    assert sass.read_text().startswith("SASS of fake assembly")
    assert not list((out / "sm_90a").glob("*.cubin")) and (out / "sm_90a" / f"{row['sass']}.key").exists()
    n = len(fake.compiles())
    aot.build(target, ops=["group_quant_fp8"], out_dir=out, asm=True)
    assert len(fake.compiles()) == n
    monkeypatch.setattr(aot, "cuobjdump", lambda tc: None)
    with pytest.raises(aot.ToolchainError, match="--asm: cuobjdump not found"):
        aot.build(target, ops=["group_quant_fp8"], out_dir=tmp_path / "other", asm=True)
    assert len(fake.compiles()) == n


def test_build_of_some_families_keeps_the_others(fake, tmp_path):
    out, target = tmp_path / "gen", get_target("gfx950")
    first = aot.build(target, ops=["group_quant_fp8", "rmsnorm"], out_dir=out)
    aot.build(target, ops=["rmsnorm"], out_dir=out)
    manifest = json.loads((out / "gfx950" / "manifest.json").read_text())
    assert len(manifest["variants"]) == len(first["variants"])
    assert {r["op"] for r in manifest["variants"]} == {"group_quant_fp8", "rmsnorm"}
    assert set(json.loads((out / "gfx950" / "dispatch.json").read_text())) == {
        "group_quant_fp8", "rmsnorm"}


BUILD_SNIPPET = """
import sys
from pathlib import Path
import codegen.build.aot as aot, codegen.build.jit as jit
from codegen.targets import get_target
from codegen.toolchain import Toolchain
tc = Toolchain("clang", sys.argv[1], "fake 1", ("-x", "hip", "--offload-arch=gfx950",
               "-nogpulib", "--cuda-device-only", "-O3", "--rocm-path=" + sys.argv[3]), False)
aot.find = jit.find = lambda target: tc
aot.build(get_target("gfx950"), ops=["group_quant_fp8"], out_dir=Path(sys.argv[2]))
"""


def test_two_builds_of_one_folder_are_serialized(fake, tmp_path):
    out = tmp_path / "gen"
    args = [sys.executable, "-c", BUILD_SNIPPET, str(fake.path), str(out),
            str(fake.tools_dir / "hip")]
    procs = [subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    assert all(p.wait(timeout=300) == 0 for p in procs), [p.stderr.read() for p in procs]
    compiles = fake.compiles()
    # every variant compiled once, and the system headers precompiled once
    assert len(compiles) == len(set(compiles)) == 54 + 1 and PCH in compiles


def test_concurrent_writers_and_readers_see_whole_files(tmp_path):
    path = tmp_path / "f.json"
    texts = [f"{i}" * 5000 for i in range(8)]
    write_if_different(path, texts[0])
    errors, seen = [], set()

    def writer(t):
        try:
            for _ in range(100):
                write_if_different(path, t)
        except Exception as e:      # noqa: BLE001
            errors.append(e)

    def reader():
        try:
            for _ in range(500):
                seen.add(path.read_text())
        except Exception as e:      # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=writer, args=(t,)) for t in texts]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and seen <= set(texts)
    assert not list(tmp_path.glob(".*.tmp"))


# ---- 3. the key ----

def test_cache_key_covers_the_hip_headers(fake):
    v = quant()
    src = jit.render(v)
    before = jit.cache_key(v, src, fake.hip_tc)
    header = fake.tools_dir / "hip" / "include" / "hip" / "hip_runtime.h"
    header.write_text("// v2, another ROCm release\n")
    os.utime(header, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert jit.cache_key(v, src, fake.hip_tc) != before


def test_precompiled_header_is_built_again_with_new_hip_headers(fake, tmp_path):
    """clang does not check system headers against a precompiled header: new HIP headers must
    rebuild it (its source names their hash), before the variants built against them."""
    out, target = tmp_path / "gen", get_target("gfx950")
    aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    assert fake.compiles().count(PCH) == 1
    header = fake.tools_dir / "hip" / "include" / "hip" / "hip_runtime.h"
    header.write_text("// v2, another ROCm release\n")
    os.utime(header, ns=(time.time_ns(), time.time_ns() + 10**9))
    aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    compiles = fake.compiles()
    assert compiles.count(PCH) == 2 and compiles.count(f"{quant().uri}.s") == 2


# ---- 4. causes named ----

def test_a_build_with_nothing_to_do_keeps_what_another_build_published(fake, tmp_path,
                                                                       monkeypatch):
    """The manifest and dispatch table are merged under the folder's lock: a build with nothing
    to do that read them just before another build published its rows does not write them
    back without those rows."""
    out, target = tmp_path / "gen", get_target("gfx950")
    aot.build(target, ops=["rmsnorm"], out_dir=out)
    real, fired = aot._read_json, []

    def read_json(path):
        text = real(path)
        if path.name == "manifest.json" and not fired:    # the other build, in this one's window
            fired.append(path)
            monkeypatch.setattr(aot, "_read_json", real)
            aot.build(target, ops=["group_quant_fp8"], out_dir=out)
        return text
    monkeypatch.setattr(aot, "_read_json", read_json)
    aot.build(target, ops=["rmsnorm"], out_dir=out)
    assert fired
    rows = json.loads((out / "gfx950" / "manifest.json").read_text())["variants"]
    table = json.loads((out / "gfx950" / "dispatch.json").read_text())
    assert {r["op"] for r in rows} == {"rmsnorm", "group_quant_fp8"}
    assert {"rmsnorm", "group_quant_fp8"} <= set(table)


def test_exit_code_is_for_the_families_built_now(tmp_path, capsys):
    """A failed row of another family, left by an earlier run, does not fail this one."""
    from codegen.cli import summarize

    row = dict(status="ok", reason=None, vgpr_count=10, spill_count=0)
    manifest = {"arch": "gfx950", "toolchain": "t", "variants": [
        {**row, "op": "rmsnorm", "uri": "a"},
        {**row, "op": "group_quant_fp8", "uri": "b", "status": "failed", "reason": "r"}]}
    assert summarize(manifest, tmp_path, ["rmsnorm"]) == 0
    assert summarize(manifest, tmp_path, ["group_quant_fp8"]) == 1
    assert summarize(manifest, tmp_path) == 1


def test_bad_jobs_are_refused_before_any_build(fake, tmp_path, monkeypatch):
    out = subprocess.run([sys.executable, "build.py", "--arch", "gfx950", "--jobs", "-3"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "--jobs" in out.stderr and "positive integer" in out.stderr
    for value in ("-3", "abc", "0"):
        monkeypatch.setenv("CODEGEN_JOBS", value)
        with pytest.raises(ValueError, match="CODEGEN_JOBS"):
            jit.compile_variant(quant())
        with pytest.raises(ValueError, match="CODEGEN_JOBS"):
            aot.build(get_target("gfx950"), ops=["group_quant_fp8"], out_dir=tmp_path / "g")
    assert fake.compiles() == []


def test_full_disk_is_named_and_leaves_no_partial_output(fake, monkeypatch):
    monkeypatch.setenv("FAKE_CC_FAIL", "enospc")
    v = quant()
    with pytest.raises(store.StorageError, match="No space left on device") as e:
        jit.compile_variant(v)
    assert "CODEGEN_CACHE_DIR" in str(e.value) and "\n" not in str(e.value)
    failed = next((fake.cache_dir / "gfx950" / v.uri).glob("failed-*"))
    assert not (failed / f"{v.uri}.s").exists() and (failed / f"{v.uri}.s.log").exists()
    monkeypatch.delenv("FAKE_CC_FAIL")

    def full(*a, **k):
        raise OSError(28, "No space left on device", str(fake.cache_dir / "x"))
    monkeypatch.setattr(store, "record", full)
    with pytest.raises(store.StorageError, match="disk is full.*CODEGEN_CACHE_DIR"):
        jit.compile_variant(v)


def test_build_exits_1_when_a_variant_failed(fake, tmp_path, monkeypatch, capsys):
    from codegen import cli

    monkeypatch.setattr(cli, "_build_fast_path", lambda: None)
    argv = ["build", "--arch", "sm_90a", "--ops", "rmsnorm", "--out", str(tmp_path / "gen")]
    monkeypatch.setenv("FAKE_CC_FAIL", "enospc")
    assert cli.main(argv) == 1
    monkeypatch.delenv("FAKE_CC_FAIL")
    assert cli.main(argv) == 0


def test_a_compile_that_fails_leaves_no_output_for_a_later_build(fake, tmp_path, monkeypatch):
    """ninja keeps what a failed command wrote: a partial module must not be recorded as built,
    nor taken for a current one by the next build."""
    out, target = tmp_path / "gen", get_target("sm_90a")      # modules (.so), no header step
    monkeypatch.setenv("FAKE_CC_FAIL", "enospc")     # writes a partial output, then fails
    rows = aot.build(target, ops=["rmsnorm"], out_dir=out)["variants"]
    assert rows and all(r["status"] == "failed" for r in rows)
    assert {r["reason"] for r in rows} == {"fatal error: No space left on device"}
    assert not list((out / "sm_90a").glob("*.so")) and not list((out / "sm_90a").glob("*.key"))
    monkeypatch.delenv("FAKE_CC_FAIL")
    rows = aot.build(target, ops=["rmsnorm"], out_dir=out)["variants"]
    assert all(r["status"] == "ok" for r in rows)


def test_a_run_with_nothing_to_do_writes_nothing(fake, tmp_path, monkeypatch):
    out, target = tmp_path / "gen", get_target("gfx950")
    aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}

    def read_only(*a, **k):
        raise OSError(30, "Read-only file system", str(out))
    monkeypatch.setattr(store, "write_atomic", read_only)
    aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(store.StorageError, match="--out"):
        aot.build(target, ops=["group_quant_fp8"], out_dir=blocker)


def test_unusable_cache_dir_names_the_variable(fake, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(blocker))
    with pytest.raises(store.StorageError, match="CODEGEN_CACHE_DIR") as e:
        jit.compile_variant(quant())
    assert str(blocker) in str(e.value)
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(tmp_path / "missing" / "cache"))
    assert jit.compile_variant(quant()).exists()              # a missing one is made


HOLD_SNIPPET = """
import sys, time
from pathlib import Path
from codegen.build import store
with store.locked(Path(sys.argv[1]), "test"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_stuck_lock_holder_is_named_and_the_wait_ends(fake, monkeypatch, capfd):
    v = quant()
    base = fake.cache_dir / "gfx950" / v.uri
    base.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_SNIPPET, str(base) + ".lock"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("CODEGEN_LOCK_TIMEOUT", "2")
        monkeypatch.setattr(store, "WAIT_NOTICE_S", 1.0)
        start = time.monotonic()
        with pytest.raises(store.LockTimeout, match=f"pid {holder.pid}") as e:
            jit.compile_variant(v)
        assert time.monotonic() - start < 10 and str(base) in str(e.value)
        assert f"held by pid {holder.pid}" in capfd.readouterr().err
    finally:
        holder.kill()
        holder.wait()


# ---- 5. leaks ----

JIT_SNIPPET = """
import sys
import codegen.build.jit as jit
from codegen.spec import make_variant
from codegen.toolchain import Toolchain
tc = Toolchain("clang", sys.argv[1], "fake 1", ("-x", "hip", "--offload-arch=gfx950",
               "-nogpulib", "--cuda-device-only", "-O3", "--rocm-path=" + sys.argv[2]), False)
jit.find = lambda target: tc
jit.compile_variant(make_variant("group_quant_fp8", "gfx950", dtype="bf16", group_size=128,
                                 fp8="e4m3fn448", scale_layout="row", ue8m0=False))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                      # a zombie (exited, not yet reaped) counts as gone
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:           # gone between the two looks
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_killed_build_leaves_no_compiler_running_and_its_staging_is_cleared(fake, tmp_path,
                                                                           monkeypatch):
    pidfile = tmp_path / "cc.pid"
    env = dict(os.environ, FAKE_CC_SLEEP="60", FAKE_CC_PIDFILE=str(pidfile))
    p = subprocess.Popen([sys.executable, "-c", JIT_SNIPPET, str(fake.path),
                          str(fake.tools_dir / "hip")], cwd=ROOT, env=env)
    deadline = time.time() + 60
    while not pidfile.exists() and time.time() < deadline:
        time.sleep(0.05)
    cc_pid = int(pidfile.read_text())
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.time() + 10
    while _alive(cc_pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(cc_pid), "the compiler outlived the killed build"
    base = fake.cache_dir / "gfx950" / quant().uri
    assert list(base.glob(".staging-*"))          # left behind by the dead builder ...
    jit.compile_variant(quant())
    assert not list(base.glob(".staging-*"))      # ... and removed by the next build


def test_ninja_starts_without_the_interpreters_fork_handlers(fake, tmp_path):
    """A fork that runs the before-fork handlers (any preexec_fn) waits for locks, logging's and
    the imports', that another thread of the caller may hold while it waits for one the fork
    took: a JIT build from a program with threads could hang. ninja is started without them."""
    seen = []
    os.register_at_fork(before=lambda: seen.append(threading.get_ident()) if armed else None)
    armed = True
    try:
        jit.compile_variant(quant())
    finally:
        armed = False
    assert seen == []


# ---- 6. sharing ----

def test_published_dirs_follow_the_umask_and_odd_paths_work(fake):
    old = os.umask(0o022)
    try:
        d = jit.compile_variant(quant())
    finally:
        os.umask(old)
    assert "$" in str(fake.cache_dir) and " " in str(fake.path)     # both paths are odd
    assert d.stat().st_mode & 0o777 == 0o755
    assert (d / f"{quant().uri}.s").stat().st_mode & 0o777 == 0o644


def test_a_build_waiting_on_its_lock_while_cache_clear_removes_its_folder_still_builds(fake):
    """The builder makes <arch>/<uri>/, then waits on <uri>.lock; cache clear, holding it,
    removes the folder. Once the lock is free the build goes on (it makes the folder again)."""
    import threading

    v = quant()
    base = jit.compile_variant(v, loadable=False).parent
    jit._verified.clear()
    shutil.rmtree(base)
    done = []
    with store.locked(Path(str(base) + ".lock"), "test"):        # cache clear's hold
        t = threading.Thread(target=lambda: done.append(jit.compile_variant(v, loadable=False)))
        t.start()
        while not base.exists():                                 # the builder made it...
            time.sleep(0.01)
        time.sleep(0.2)                                          # ...and waits on the lock
        shutil.rmtree(base)                                      # cache clear removes it
    t.join(60)
    assert done and any(done[0].iterdir())


# ---- 7. ahead-of-time modules: what makes one current ----

def _aot_folder(tmp_path, monkeypatch, arch="sm_90a", ops=("group_quant_fp8",)) -> Path:
    out = tmp_path / "gen"
    aot.build(get_target(arch), ops=list(ops), out_dir=out)
    monkeypatch.setenv("CODEGEN_AOT_DIR", str(out))
    return out / arch


def test_an_ahead_of_time_module_that_fails_to_load_stays_and_the_cache_serves(
        fake, tmp_path, monkeypatch):
    """Eviction is the JIT cache's: a module of generated/ (or of a prebuilt package) that does
    not load is left where it is, with its folder, and the JIT build is loaded instead."""
    import ctypes
    from codegen import dispatch

    d = _aot_folder(tmp_path, monkeypatch)
    v = make_variant("group_quant_fp8", "sm_90a", **V)
    so = jit.aot_module(v)
    assert so == d / f"{v.uri}.so"
    jit.evict_module(v, so)
    assert so.exists() and (d / "manifest.json").exists()
    real = ctypes.PyDLL

    def pydll(path, *a, **k):
        if Path(path) == so:
            raise OSError("invalid ELF header")
        return real(path, *a, **k)
    monkeypatch.setattr(dispatch.ctypes, "PyDLL", pydll)
    lib = dispatch._load(v)
    assert so.exists() and fake.cache_dir in Path(lib._name).parents


def test_a_cached_module_that_fails_to_load_is_built_again_once(fake, monkeypatch):
    import ctypes
    from codegen import dispatch

    v = make_variant("group_quant_fp8", "sm_90a", **V)
    jit.compile_variant(v, loadable=True)
    builds, real, calls = jit.BUILDS, ctypes.PyDLL, []

    def pydll(path, *a, **k):
        calls.append(path)
        if len(calls) == 1:
            raise OSError("file too short")
        return real(path, *a, **k)
    monkeypatch.setattr(dispatch.ctypes, "PyDLL", pydll)
    assert dispatch._load(v) is not None
    assert jit.BUILDS == builds + 1 and len(calls) == 2


def test_an_ahead_of_time_module_of_another_version_is_built_again(fake, tmp_path,
                                                                   monkeypatch):
    """The package version is in the key but not in build.ninja: ninja alone would keep the
    old module; the build must see that its key no longer matches."""
    d = _aot_folder(tmp_path, monkeypatch)
    v = make_variant("group_quant_fp8", "sm_90a", **V)
    n = fake.compiles().count(f"{v.uri}.so")
    monkeypatch.setattr(jit, "__version__", "0.0.0+another")
    assert jit.aot_module(v) is None                     # not loaded as this version's
    aot.build(get_target("sm_90a"), ops=["group_quant_fp8"], out_dir=d.parent)
    assert fake.compiles().count(f"{v.uri}.so") == n + 1
    assert jit.aot_module(v) == d / f"{v.uri}.so"


def test_an_ahead_of_time_module_changed_in_place_is_not_loaded(fake, tmp_path, monkeypatch):
    d = _aot_folder(tmp_path, monkeypatch)
    v = make_variant("group_quant_fp8", "sm_90a", **V)
    so = d / f"{v.uri}.so"
    data = bytearray(so.read_bytes())
    data[-1] ^= 0xFF                                     # the same size, other bytes
    so.write_bytes(bytes(data))
    assert jit.aot_module(v) is None


def test_a_lost_manifest_alone_is_written_again(fake, tmp_path, monkeypatch):
    d = _aot_folder(tmp_path, monkeypatch)
    (d / "manifest.json").unlink()
    n = len(fake.compiles())
    aot.build(get_target("sm_90a"), ops=["group_quant_fp8"], out_dir=d.parent)
    assert json.loads((d / "manifest.json").read_text())["arch"] == "sm_90a"
    assert len(fake.compiles()) == n                     # nothing compiled for it


def test_the_dispatch_table_lists_only_what_built(fake, tmp_path, monkeypatch):
    out, target = tmp_path / "gen", get_target("sm_90a")
    aot.build(target, ops=["group_quant_fp8"], out_dir=out)
    monkeypatch.setenv("FAKE_CC_FAIL", "enospc")
    rows = aot.build(target, ops=["rmsnorm"], out_dir=out)["variants"]
    assert {r["status"] for r in rows if r["op"] == "rmsnorm"} == {"failed"}
    table = json.loads((out / "sm_90a" / "dispatch.json").read_text())
    status = {r["uri"]: r["status"] for r in rows}
    listed = [e["uri"] for entries in table.values() for e in entries]
    assert listed and "rmsnorm" not in table
    assert all(status[u] == "ok" for u in listed)


def test_only_staging_of_builders_known_dead_is_removed(tmp_path, monkeypatch):
    """A staging folder is removed only where its builder ran on this host and is gone: another
    host's (a shared cache) and another user's live one stay."""
    import socket

    host = socket.gethostname()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    names = {"dead": f".staging-{host}-{gone.pid}-a", "alive": f".staging-{host}-{os.getpid()}-b",
             "other_host": f".staging-{host}x-{gone.pid}-c", "odd": ".staging-junk",
             "other_user": f".staging-{host}-1-d"}
    for n in names.values():
        (tmp_path / n).mkdir()
    real_kill = os.kill

    def kill(pid, sig):
        if pid == 1:
            raise PermissionError(1, "Operation not permitted")
        return real_kill(pid, sig)
    monkeypatch.setattr(os, "kill", kill)
    store.remove_dead_staging(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n for k, n in names.items() if k != "dead")


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_files_written_whole_follow_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        store.write_atomic(tmp_path / "manifest.json", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "manifest.json").stat().st_mode & 0o777 == mode


def test_explain_names_the_module_that_would_serve(fake, tmp_path, monkeypatch):
    from codegen.cli import explain

    monkeypatch.setattr("codegen.toolchain.find", jit.find)     # the stand-in's, as jit's
    v = make_variant("group_quant_fp8", "sm_90a", **V)
    ask = dict(dtype="bf16", group_size=128, scale_layout="row", ue8m0=False)
    assert explain("sm_90a", "group_quant_fp8", ask)[-1].startswith("module: not built yet")
    d = jit.compile_variant(v)
    assert explain("sm_90a", "group_quant_fp8", ask)[-1] == f"module: JIT cache {d}"
    aot_dir = _aot_folder(tmp_path, monkeypatch)
    assert explain("sm_90a", "group_quant_fp8", ask)[-1] == \
        f"module: ahead-of-time build {aot_dir / f'{v.uri}.so'}"


def test_assembly_without_kernel_metadata_is_a_failed_build(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CC_NO_METADATA", "1")
    out = tmp_path / "gen"
    rows = aot.build(get_target("gfx950"), ops=["group_quant_fp8"], out_dir=out)["variants"]
    assert rows and {r["status"] for r in rows} == {"failed"}
    assert all("holds no kernel metadata" in r["reason"] for r in rows)
    assert json.loads((out / "gfx950" / "dispatch.json").read_text()) == {}
