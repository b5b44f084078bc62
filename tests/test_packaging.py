"""The package as a user installs it: the wheel's contents, the CLI from an installed copy in
another directory (writing nothing beside itself), and prebuilt kernels shipped as a wheel that
many processes load at once with no compiler."""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_build_integrity import FAKE_CC

ROOT = Path(__file__).resolve().parent.parent


def run(args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (whl,) = out.glob("fp8_codegen-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(site), str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return site


def files_of(tree: Path) -> dict[str, int]:
    return {str(p.relative_to(tree)): p.stat().st_mtime_ns for p in tree.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_the_wheel_holds_templates_headers_specs_tables_and_the_shim(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for kind, where in ((".j2", "codegen/templates/"), (".cuh", "codegen/templates/include/"),
                        (".h", "codegen/templates/include/"), (".toml", "codegen/specs/"),
                        (".json", "codegen/tables/"), (".hip", "codegen/emu/")):
        assert any(n.startswith(where) and n.endswith(kind) for n in names), (kind, names)
    templates = {p.name for p in (ROOT / "templates").glob("*.j2")}
    assert templates == {Path(n).name for n in names if n.endswith(".j2")}
    assert "codegen/cli.py" in names and "codegen/nn/__init__.py" in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Name: fp8-codegen" in meta


@pytest.mark.isa
def test_the_installed_package_builds_elsewhere_and_writes_nothing_beside_itself(
        installed, tmp_path):
    before = files_of(installed)
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(installed), HOME=str(tmp_path / "home"),
               CODEGEN_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CODEGEN_AOT_DIR", None)
    out = tmp_path / "kernels"
    r = run(["-m", "codegen", "build", "--arch", "gfx942", "--ops", "dual_rmsnorm_group_quant",
             "--out", str(out)], cwd=elsewhere, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads((out / "gfx942" / "manifest.json").read_text())
    assert manifest["variants"] and all(v["status"] == "ok" for v in manifest["variants"])
    assert (out / "gfx942" / manifest["variants"][0]["asm"]).exists()
    doctor = run(["-m", "codegen", "doctor"], cwd=elsewhere, env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"codegen 0.1.0 from {installed / 'codegen'}" in doctor.stdout
    assert "gfx942   clang" in doctor.stdout and "(source checkout)" not in doctor.stdout
    assert str(tmp_path / "home" / ".local" / "share" / "codegen") in doctor.stdout
    jit = run(["-c", "import codegen.build.jit as j; from codegen.spec import make_variant; "
               "print(j.compile_variant(make_variant('rmsnorm', 'gfx942', dtype='bf16', "
               "residual=False, load='vec16')))"], cwd=elsewhere, env=env)
    assert jit.returncode == 0, jit.stderr
    assert Path(jit.stdout.strip()).is_relative_to(tmp_path / "cache")
    assert files_of(installed) == before
    assert os.listdir(elsewhere) == []


def test_cli_exit_codes_name_the_cause(tmp_path):
    r = run(["-m", "codegen", "build", "--arch", "gfx1030"], cwd=ROOT)
    assert r.returncode == 2 and "--arch" in r.stderr and "gfx942" in r.stderr
    r = run(["-m", "codegen", "build", "--arch", "gfx942", "--ops", "gemm"], cwd=ROOT)
    assert r.returncode == 2 and "--ops: unknown gemm" in r.stderr
    assert "compiling" not in r.stderr      # refused before any progress is shown
    r = run(["-m", "codegen", "cache", "clear", "--arch", "gfx1030"], cwd=ROOT,
            env={**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 2 and "--arch: unknown arch 'gfx1030'" in r.stderr
    r = run(["-m", "codegen", "list", "--arch", "gfx942", "--out", str(tmp_path)], cwd=ROOT)
    assert r.returncode == 2 and "no manifest" in r.stderr and "codegen build" in r.stderr
    r = run(["-m", "codegen", "explain", "--arch", "sm_90a", "gemm_a8w8_blockscale"], cwd=ROOT)
    assert r.returncode == 2 and "--m M --n N --k K" in r.stderr
    r = run(["-m", "codegen", "explain", "--arch", "gfx942", "rmsnorm", "dtyp=bf16"], cwd=ROOT)
    assert r.returncode == 2 and "no axis dtyp" in r.stderr
    r = run(["-m", "codegen", "explain", "--arch", "gfx942", "rmsnorm", "dtype=int8"], cwd=ROOT)
    assert r.returncode == 2 and "dtype='int8' is not one of" in r.stderr
    from codegen import knobs
    if not knobs.rocm_path():      # assembly only (or no toolchain): refused before compiling
        r = run(["-m", "codegen", "build", "--arch", "gfx942", "--ops", "rmsnorm", "--out",
                 str(tmp_path / "aot"), "--wheel"], cwd=ROOT)
        assert r.returncode == 2 and "--wheel" in r.stderr and "compiling" not in r.stderr
    bad_jobs = {**os.environ, "CODEGEN_JOBS": "0"}
    r = run(["-m", "codegen", "build", "--arch", "gfx942", "--ops", "rmsnorm", "--out",
             str(tmp_path / "aot")], cwd=ROOT, env=bad_jobs)
    assert r.returncode == 2 and "CODEGEN_JOBS" in r.stderr and "compiling" not in r.stderr
    r = run(["-m", "codegen", "doctor"], cwd=ROOT, env=bad_jobs)
    assert r.returncode == 1 and "environment: CODEGEN_JOBS='0'" in r.stdout
    (tmp_path / "a_file").write_text("x")
    r = run(["-m", "codegen", "doctor"], cwd=ROOT,
            env={**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "a_file" / "cache")})
    assert r.returncode == 1 and "a_file is not a folder" in r.stdout
    r = run(["-m", "codegen.bench", "--sections", "gem"], cwd=ROOT)
    assert r.returncode == 2 and "--sections: unknown gem" in r.stderr
    r = run(["-m", "codegen.tune", "--shapes", "576x"], cwd=ROOT)
    assert r.returncode == 2 and "--shapes" in r.stderr
    for m in ("1", "16"):      # an answer, not an error: no variant serves it there
        r = run(["-m", "codegen", "explain", "--arch", "gfx1100", "gemm_a8w8_blockscale", "--m",
                 m, "--n", "128", "--k", "128"], cwd=ROOT)
        assert r.returncode == 0 and "no FP8 support" in r.stdout, r.stderr


def test_cache_clear_removes_only_the_caches_folders(tmp_path):
    (tmp_path / "gfx942" / "v").mkdir(parents=True)
    (tmp_path / "fastcall").mkdir()
    (tmp_path / "notes.txt").write_text("the user's")
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path)}
    r = run(["-m", "codegen", "cache"], cwd=ROOT, env=env)
    assert r.returncode == 0 and "gfx942" in r.stdout and "notes" not in r.stdout
    r = run(["-m", "codegen", "cache", "clear"], cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_cache_clear_waits_for_a_build_and_keeps_its_lock(tmp_path, monkeypatch):
    import threading

    from codegen.build import store

    arch = tmp_path / "gfx942"
    (arch / "v" / "key").mkdir(parents=True)
    (arch / "v" / "key" / "v.so").write_bytes(b"module")
    lock = arch / "v.lock"
    done = threading.Event()
    with store.locked(lock, "test"):                 # a build of v runs
        t = threading.Thread(target=lambda: (store.clear(arch, "test"), done.set()))
        t.start()
        assert not done.wait(0.5) and (arch / "v" / "key" / "v.so").exists()
    t.join(30)
    assert done.is_set() and sorted(p.name for p in arch.iterdir()) == ["v.lock"]
    r = run(["-m", "codegen", "cache"], cwd=ROOT, env={**os.environ, "CODEGEN_CACHE_DIR":
                                                         str(tmp_path)})
    assert r.returncode == 0 and "gfx942" not in r.stdout and "empty" in r.stdout   # cleared


def test_cache_clear_holds_one_lock_at_a_time(tmp_path, monkeypatch):
    """A cache of many variants: clear never holds more than one lock (an open file each)."""
    import contextlib

    from codegen.build import store

    arch = tmp_path / "gfx942"
    for i in range(50):
        (arch / f"v{i}" / "key").mkdir(parents=True)
        (arch / f"v{i}.lock").touch()
    held, most, real = [0], [0], store.locked

    @contextlib.contextmanager
    def counting(lock, origin):
        with real(lock, origin):
            held[0] += 1
            most[0] = max(most[0], held[0])
            yield
            held[0] -= 1
    monkeypatch.setattr(store, "locked", counting)
    store.clear(arch, "test")
    assert most[0] == 1 and sorted(p.name for p in arch.iterdir()) == sorted(
        f"v{i}.lock" for i in range(50))


def test_explain_takes_a_partitions_multiprocessors():
    """The heuristic's pick depends on the multiprocessors; a partition (MI300X in CPX mode:
    38 CUs) has fewer than the part explain assumes."""
    from codegen.cli import CliError, explain
    from codegen.families import gemm

    m, n, k = 1024, 3000, 4096
    full, part = gemm.pick("gfx942", m, n, k), gemm.pick("gfx942", m, n, k, 38)
    assert full != part
    lines = explain("gfx942", gemm.FAMILY, {}, m, n, k, cus=38)
    assert f"config: {json.dumps(part)}" in lines
    assert any("38 multiprocessors (--cus)" in line for line in lines)
    assert f"config: {json.dumps(full)}" in explain("gfx942", gemm.FAMILY, {}, m, n, k)
    with pytest.raises(CliError, match="--cus: explain uses it for the GEMM's"):
        explain("gfx942", "rmsnorm", {}, hidden=4096, cus=38)


def test_explain_says_table_hit_or_heuristic():
    from codegen.cli import explain
    from codegen.families import gemm

    (m, n, k), cfg = next(iter(gemm.table("sm_90a").items()))
    lines = explain("sm_90a", gemm.FAMILY, {}, m, n, k)
    assert any(line.startswith("why: table hit") for line in lines)
    assert lines[0].startswith(f"variant: gemm_a8w8_blockscale_e4m3fn448_{cfg['kernel']}_")
    assert json.loads(lines[1].removeprefix("config: ")) == cfg
    lines = explain("gfx942", gemm.FAMILY, {}, 3000, 100, 512)
    assert any(line.startswith("why: heuristic by M") for line in lines)
    assert json.loads(lines[1].removeprefix("config: ")) == gemm.heuristic("gfx942", 3000, 100)
    lines = explain("gfx942", gemm.FAMILY, {}, 16, 2112, 7000)   # picked as K = 7008
    assert json.loads(lines[1].removeprefix("config: ")) == gemm.pick("gfx942", 16, 2112, 7008)
    assert lines[3] == ("K: 7000 is read as 7008: A and B are copied per call into zero-padded "
                        "rows (rows are read 16 bytes at a time)")
    lines = explain("gfx1100", "group_quant_fp8", {"dtype": "bf16"})
    assert lines == ["unsupported: arch gfx1100 has no FP8 support; group_quant_fp8 is not "
                     "offered there"]


def test_explain_says_what_an_mma_wave_holds():
    from codegen.cli import explain
    from codegen.families import gemm
    from codegen.spec import make_variant

    lines = explain("sm_90a", gemm.FAMILY, {}, 1, 4096, 7168)
    entry = gemm.table("sm_90a")[(1, 4096, 7168)]   # one K block, bounded, early first pass
    assert entry["kernel"] == "mma" and entry["stages"] == 1 and entry["l2_first_pass"]
    v = make_variant(gemm.FAMILY, "sm_90a", fp8="e4m3fn448", **entry)
    atom = gemm.atom_for("sm_90a", "mma", "")
    blocks, cap = gemm.mma_min_blocks(v, atom), gemm.mma_register_cap(v, atom)
    assert blocks >= 2 and cap >= 64
    assert "mma waves hold one K block of fragments in registers; " \
           f"{blocks} blocks an SM asked of the compiler (at most {cap} registers a lane)" in lines
    assert "each block starts its first pass over its weight rows into L2 before it waits for " \
           "the grid before (l2_first_pass)" in lines
    lines = explain("gfx942", gemm.FAMILY, {}, 2, 576, 7168)
    assert "mma waves hold two K blocks of fragments in registers" in lines


def test_explain_names_the_row_kernel():
    from codegen.cli import explain

    rgq = {"dtype": "bf16", "group_size": 128, "ue8m0": False}
    row = [line for line in explain("sm_90a", "rmsnorm_group_quant", {**rgq, "residual": False},
                                    hidden=4096) if line.startswith("row kernel")]
    assert row and "128 threads per row, 4 chunks" in row[0]
    assert "summing as 256 threads x 2" in row[0]
    row = [line for line in explain("sm_90a", "rmsnorm_group_quant", {**rgq, "residual": True},
                                    hidden=4096) if line.startswith("row kernel")]
    assert row and "256 threads per row, 2 chunks" in row[0] and "summing" not in row[0]



def test_explain_follows_the_ops_rules():
    from codegen.cli import explain
    from codegen.families import gemm
    from codegen.spec import make_variant

    assert "variant: rmsnorm_bf16_scalar" in explain("sm_90a", "rmsnorm", {"dtype": "bf16"},
                                                    hidden=4100)     # rows not 16-byte aligned
    assert "variant: rmsnorm_bf16_vec16" in explain("sm_90a", "rmsnorm", {"dtype": "bf16"},
                                                   hidden=4096)
    assert explain("sm_90a", gemm.FAMILY, {}, 2**31, 4096, 7168) == [
        "unsupported: dimensions (2147483648, 4096, 7168) must be below 2^31"]
    cfg = gemm.pick("sm_90a", 4096, 4096, 7168)
    mine = {**cfg, "stages": cfg["stages"] - 1, "fp8": "e4m3fn448"}     # the caller's axis wins
    lines = explain("sm_90a", gemm.FAMILY, {"stages": mine["stages"]}, 4096, 4096, 7168)
    assert lines[0] == f"variant: {make_variant(gemm.FAMILY, 'sm_90a', **mine).uri}"


def test_explain_takes_axis_values_after_its_options(capsys):
    from codegen.cli import main

    assert main(["explain", "--arch", "sm_90a", "rmsnorm_group_quant", "--hidden", "4096",
                 "dtype=bf16", "group_size=128"]) == 0
    assert "row kernel" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["explain", "--arch", "sm_90a", "rmsnorm", "--bogus", "1"])

# ---- prebuilt kernels: a wheel, or a shared folder, loaded by many processes ----

LOAD = """
import sys
import codegen.build.jit as jit
from codegen.dispatch import kernel
from codegen.spec import make_variant
v = make_variant('group_quant_fp8', 'sm_90a', dtype='bf16', group_size=128, fp8='e4m3fn448',
                 scale_layout='row', ue8m0=False)
kernel(v)
print(jit.aot_module(v), jit.BUILDS)
"""


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """sm_90a group_quant modules from a stand-in nvcc (real tiny .so files), in a folder and
    packed as a wheel, installed into its own site dir."""
    tmp = tmp_path_factory.mktemp("prebuilt")
    cc = tmp / "nvcc"
    cc.write_text(FAKE_CC)
    cc.chmod(0o755)
    env = dict(os.environ, CODEGEN_NVCC=str(cc), CODEGEN_CACHE_DIR=str(tmp / "cache"))
    r = run(["-m", "codegen", "build", "--arch", "sm_90a", "--ops", "group_quant_fp8", "--out",
             str(tmp / "aot"), "--wheel", str(tmp / "dist")], cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (tmp / "dist").glob("fp8_codegen_kernels_sm_90a-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "codegen_kernels_sm_90a/manifest.json" in names
    assert sum(n.endswith(".so") for n in names) == sum(n.endswith(".so.key") for n in names) > 1
    site = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(site), str(whl)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return tmp


@pytest.mark.parametrize("source", ["wheel", "folder"])
def test_eight_processes_load_prebuilt_kernels_with_no_compiler_and_no_build(
        prebuilt, source, tmp_path):
    env = dict(os.environ, CODEGEN_NVCC=str(tmp_path / "no-nvcc"),
               CODEGEN_CACHE_DIR=str(tmp_path / "empty-cache"))
    if source == "wheel":
        env.update(PYTHONPATH=os.pathsep.join([str(prebuilt / "site"), str(ROOT)]),
                   CODEGEN_AOT_DIR=str(tmp_path / "no-aot"))
        expected = prebuilt / "site" / "codegen_kernels_sm_90a"
    else:
        env.update(PYTHONPATH=str(ROOT), CODEGEN_AOT_DIR=str(prebuilt / "aot"))
        expected = prebuilt / "aot" / "sm_90a"
    procs = [subprocess.Popen([sys.executable, "-c", LOAD], env=env, cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(8)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    for out, _ in results:
        path, builds = out.split()
        assert Path(path).parent == expected and builds == "0"
    assert not (tmp_path / "empty-cache").exists()


def test_a_prebuilt_module_of_other_source_is_not_loaded(prebuilt, tmp_path):
    """Its .key names another source: the loader passes it by and goes to JIT (here: no
    compiler, so the error names it)."""
    aot = tmp_path / "aot"
    subprocess.run(["cp", "-r", str(prebuilt / "aot"), str(aot)], check=True)
    for key in (aot / "sm_90a").glob("*.so.key"):
        k, size, digest, _ = key.read_text().split()
        key.write_text(f"{k} {size} {digest} {'0' * 24}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CODEGEN_AOT_DIR=str(aot),
               CODEGEN_NVCC=str(tmp_path / "no-nvcc"), CODEGEN_CACHE_DIR=str(tmp_path / "c"))
    r = run(["-c", LOAD], env=env, cwd=tmp_path)
    assert r.returncode != 0 and "nvcc not found" in r.stderr


def test_a_bare_wheel_flag_packs_beside_the_build_and_list_takes_a_closed_pipe(prebuilt, tmp_path):
    """`--wheel` without DIR writes beside OUT/<arch>, not into the working directory, and
    says where; `list | head` ends quietly when head stops reading."""
    env = dict(os.environ, CODEGEN_NVCC=str(prebuilt / "nvcc"),
               CODEGEN_CACHE_DIR=str(prebuilt / "cache"), PYTHONPATH=str(ROOT))
    r = run(["-m", "codegen", "build", "--arch", "sm_90a", "--ops", "group_quant_fp8", "--out",
             str(prebuilt / "aot"), "--wheel"], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.listdir(tmp_path) == []
    (whl,) = (prebuilt / "aot").glob("fp8_codegen_kernels_sm_90a-*.whl")
    assert f"wheel: {whl}" in r.stdout
    read, write = os.pipe()
    os.close(read)       # the reader is gone before the first row
    try:
        r = subprocess.run([sys.executable, "-m", "codegen", "list", "--arch", "sm_90a",
                            "--out", str(prebuilt / "aot")], stdout=write,
                           stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    finally:
        os.close(write)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_cache_lists_each_arch_and_clears_only_the_one_named(tmp_path, monkeypatch, capsys):
    """Arch folders hold a lock file beside each module folder: they are listed with their
    modules, and `cache clear --arch` clears that arch's alone."""
    from codegen.cli import main

    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(tmp_path))
    for arch in ("gfx942", "gfx1201"):
        module = tmp_path / arch / "v" / "k1"
        module.mkdir(parents=True)
        (module / "artifact.json").write_text("{}")
        (tmp_path / arch / "v.lock").write_text("")
    assert main(["cache"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {arch:<8}    1 modules" in listed for arch in ("gfx942", "gfx1201")), listed
    assert main(["cache", "clear", "--arch", "gfx942"]) == 0
    assert not (tmp_path / "gfx942" / "v").exists() and (tmp_path / "gfx1201" / "v" / "k1").is_dir()
    capsys.readouterr()
    assert main(["cache"]) == 0
    listed = capsys.readouterr().out
    assert "gfx1201" in listed and "gfx942" not in listed, listed


def test_cli_passes_its_options_through(capsys, monkeypatch):
    """explain's --cus and axis=true reach the pick and the variant; --arch native on a host
    without a GPU is a named error (exit 2), not a traceback; counts below 1 are refused."""
    from codegen import cli

    assert cli.main(["explain", "--arch", "gfx942", "gemm_a8w8_blockscale", "--m", "1024",
                     "--n", "4096", "--k", "7168", "--cus", "38"]) == 0
    assert "38 multiprocessors (--cus)" in capsys.readouterr().out
    assert cli.main(["explain", "--arch", "sm_90a", "rmsnorm", "dtype=bf16", "residual=true"]) == 0
    assert "variant: rmsnorm_bf16_residual" in capsys.readouterr().out
    for dtype, load in (("fp32", "vec16"), ("bf16", "scalar")):     # rows of 4100 values
        assert cli.explain("sm_90a", "rmsnorm", {"dtype": dtype}, hidden=4100)[0] ==             f"variant: rmsnorm_{dtype}_{load}"

    def no_gpu():
        raise RuntimeError("no GPU found")
    monkeypatch.setattr(cli, "native_arch", no_gpu)
    assert cli.main(["build", "--arch", "native"]) == 2
    assert "--arch: no GPU found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["build", "--arch", "gfx942", "--jobs", "0"])


def test_list_reads_an_installed_prebuilt_manifest_only_without_out(tmp_path, monkeypatch,
                                                                     capsys):
    """`list` with nothing built here shows the installed prebuilt package's manifest; with
    --out it lists that folder alone and says where to build."""
    from codegen import paths
    from codegen.cli import main

    pre = tmp_path / "prebuilt"
    pre.mkdir()
    row = {"uri": "gfx942/rmsnorm/x", "op": "rmsnorm", "status": "built"}
    (pre / "manifest.json").write_text(json.dumps({"variants": [row]}))
    monkeypatch.setenv("CODEGEN_AOT_DIR", str(tmp_path / "aot"))
    monkeypatch.setattr(paths, "prebuilt_dir", lambda arch: pre if arch == "gfx942" else None)
    assert main(["list", "--arch", "gfx942"]) == 0
    out = capsys.readouterr().out
    assert str(pre / "manifest.json") in out and "gfx942/rmsnorm/x" in out and "1 built" in out
    assert main(["list", "--arch", "gfx942", "--out", str(tmp_path / "elsewhere")]) == 2
    err = capsys.readouterr().err
    assert "no manifest at" in err and "elsewhere" in err and "codegen build --arch gfx942" in err


def test_doctor_names_a_missing_part_of_the_install(tmp_path, monkeypatch, capsys):
    """An install without its templates (or headers, specs, tables) is a fault doctor names."""
    from codegen import paths
    from codegen.cli import main

    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CODEGEN_AOT_DIR", str(tmp_path / "aot"))
    for knob in ("CODEGEN_JOBS", "CODEGEN_LOCK_TIMEOUT"):      # faults of their own
        monkeypatch.delenv(knob, raising=False)
    assert main(["doctor"]) == 0
    assert "MISSING" not in capsys.readouterr().out
    monkeypatch.setattr(paths, "TEMPLATE_DIR", tmp_path / "gone")
    assert main(["doctor"]) == 1
    assert f"templates  MISSING  0 in {tmp_path / 'gone'}" in capsys.readouterr().out
