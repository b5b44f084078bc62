"""What makes a build folder trustworthy: outputs recorded at publish and verified before use,
atomic writes, locks that say who holds them, permissions that follow the umask, and errors
that name the path and the setting that chose it."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

from filelock import FileLock, Timeout

from .. import knobs

RECORD = "artifact.json"     # in a published cache dir: {file: [size, sha256]}
WAIT_NOTICE_S = 5.0


class StorageError(RuntimeError):
    """A folder or file the build needs cannot be written or read (one line, names the cause)."""


class LockTimeout(StorageError):
    pass


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@cache
def _file_hash(path: Path, _stamp: tuple) -> str:
    return sha256(path)


def file_hash(path: Path) -> str:
    """Content hash of a file, recomputed when its size or mtime changes."""
    st = path.stat()
    return _file_hash(path, (st.st_size, st.st_mtime_ns))


def tree_hash(root: Path) -> str:
    """Content hash of every file under root (the HIP headers a toolchain compiles with);
    each file is hashed again only when its size or mtime changes."""
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            p = Path(dirpath) / name
            h.update(f"{p.relative_to(root)}\0{file_hash(p)}\n".encode())
    return h.hexdigest()


def describe(path: Path) -> list:
    return [path.stat().st_size, sha256(path)]


def record(folder: Path, names: list[str]) -> None:
    """Writes what each output is (size, hash), so that a later reader can check it."""
    write_atomic(folder / RECORD, json.dumps({n: describe(folder / n) for n in names}) + "\n")


def damage(folder: Path, names: list[str]) -> str | None:
    """Why a published folder cannot be used as it is, or None when every output checks."""
    try:
        recorded = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return f"{folder / RECORD} is missing or unreadable"
    for n in names:
        p = folder / n
        if n not in recorded:
            return f"{n} is not in its record"
        if not p.exists():
            return f"{p} is missing"
        size, digest = recorded[n]
        if p.stat().st_size != size:
            return f"{p} has {p.stat().st_size} bytes, {size} were published"
        if sha256(p) != digest:
            return f"{p} differs from what was published"
    return None


def write_atomic(path: Path, text: str) -> None:
    """Replace path's content at once (a unique temp name in its folder, then rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def share(folder: Path) -> None:
    """Folders made by mkdtemp are 0700: give them the umask's mode, as mkdir would."""
    mode = 0o777 & ~umask()
    for dirpath, dirs, _ in os.walk(folder):
        os.chmod(dirpath, mode)


def storage_error(e: OSError, origin: str) -> StorageError:
    what = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only",
            errno.EACCES: "permission denied", errno.EDQUOT: "the disk quota is exceeded",
            errno.ENOTDIR: "a file stands where a folder is needed",
            errno.EEXIST: "a file stands where a folder is needed"}.get(e.errno, e.strerror)
    return StorageError(f"cannot write {e.filename or '?'}: {what} (the folder is chosen by "
                        f"{origin})")


def ensure_dir(path: Path, origin: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise storage_error(e, origin) from None
    if not path.is_dir():
        raise StorageError(f"{path} is not a folder (chosen by {origin})")
    return path


# ---- locks ----

def _holder_path(lock: Path) -> Path:
    return lock.with_name(lock.name + ".holder")


def _holder(lock: Path) -> str:
    try:
        info = json.loads(_holder_path(lock).read_text())
        since = time.strftime("%H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on {info['host']} since {since} ({info['argv']})"
    except (OSError, ValueError, KeyError):
        return "an unknown process"


@contextlib.contextmanager
def locked(lock: Path, origin: str):
    """An OS-released file lock; after a few seconds of waiting it says who holds it, and it
    gives up after CODEGEN_LOCK_TIMEOUT naming the lock and the holder."""
    limit = knobs.lock_timeout()
    try:
        flock = FileLock(str(lock), mode=0o666 & ~umask())
    except TypeError:          # filelock before 3.10 has no mode
        flock = FileLock(str(lock))
    start = time.monotonic()
    told = False
    while True:
        try:
            flock.acquire(timeout=WAIT_NOTICE_S if not told else 1.0)
            break
        except Timeout:
            waited = time.monotonic() - start
            if waited >= limit:
                raise LockTimeout(f"gave up after {waited:.0f} s waiting for {lock}, held by "
                                  f"{_holder(lock)} (CODEGEN_LOCK_TIMEOUT={limit:g})") from None
            if not told:
                print(f"codegen: waiting for {lock}, held by {_holder(lock)}", file=sys.stderr)
                told = True
        except OSError as e:
            raise storage_error(e, origin) from None
    try:
        with contextlib.suppress(OSError):
            write_atomic(_holder_path(lock), json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                 "argv": " ".join(sys.argv)[:200]}))
        yield
    finally:
        with contextlib.suppress(OSError):
            _holder_path(lock).unlink()
        flock.release()


# ---- staging folders of builders that died ----

def staging_prefix() -> str:
    return f".staging-{socket.gethostname()}-{os.getpid()}-"


def remove_dead_staging(base: Path) -> None:
    """Staging folders whose builder (this host, that pid) is gone: nothing will finish them."""
    host = socket.gethostname()
    for d in base.glob(".staging-*"):
        parts = d.name[len(".staging-"):].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
            continue                 # alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue                 # alive, another user's
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def clear(folder: Path, origin: str) -> None:
    """Removes what a cache folder holds: each folder <name> in it under the lock beside it
    (<name>.lock) where there is one, which its builders hold while they write in it (they make
    the folder again once they hold it), one lock at a time. The lock files stay: a process may
    be waiting on one, and a new file under the same name would let two builders in at once."""
    import shutil

    try:
        for path in sorted(folder.iterdir()):
            lock = path.with_name(path.name + ".lock")
            if path.name.endswith((".lock", ".lock.holder")):
                continue
            if not path.is_dir() or path.is_symlink():
                path.unlink(missing_ok=True)
            elif lock.exists():
                with locked(lock, origin):
                    shutil.rmtree(path)
            else:
                shutil.rmtree(path)
        if not any(folder.iterdir()):
            folder.rmdir()
    except OSError as e:
        raise storage_error(e, origin) from None
