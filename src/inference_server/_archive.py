"""Model archives (``model.tar.gz``) unpacked safely into a cache directory, and model directories kept inside their
roots, for multi-model endpoints.

A multi-model endpoint names its model per request (``TargetModel``); :func:`model_directory` finds it under the
model root, as a directory or as a tarball that :func:`unpack` turns into one before ``model_fn(model_dir)`` runs.
A model loaded by its path (``POST /models``) must lie in one of the directories models may load from:
:func:`confined` resolves its symbolic links, and the roots' own, before comparing. Messages about a ``TargetModel``
name paths relative to the model root, never the root itself nor where a link leads (the server's log does).

An archive is not trusted. Each member is checked before anything of it is written, so that a refusal says which
member and why: no absolute or escaping names, no path through a symbolic link or a file, no duplicates, no devices,
FIFOs or other special members, no hard link except to an earlier file, at most ``max_members`` members and
``max_bytes`` declared bytes. Then :func:`tarfile.data_filter` (PEP 706) checks it again, and the module writes it
itself, into names it has normalised, counting the bytes it writes: no member writes more than its header declared,
so no archive writes more than ``max_bytes``. Symbolic links are checked last, against the whole
archive's table of links, because one link's target can pass through another that comes later; the filter's own
``realpath`` check sees only the links already on disk (and had bypasses fixed after 3.11.7, CVE-2025-4517). After
the end of the tar, the rest of the compressed stream is read (within the byte limit) so that gzip's checksum is
verified and a corrupted model is refused rather than loaded.

Extraction is one pass: checking every header first would decompress a large ``.tar.gz`` twice, and a model is loaded
while its first request waits. The cost is that an archive refused for a late member has written the earlier ones,
into a temporary directory that is then removed. The unpacked directory appears only by an atomic ``os.rename`` of
that temporary directory, named for the archive's resolved path, size and modification time: a second call, or another
worker process, finds it complete or not at all, and a changed archive unpacks anew. Workers asking for one archive at
once take turns on a lock file beside it in the cache (``.NAME.lock``, removed after): one unpacks, once per machine,
and the others find its result. Copies of older versions stay in
the cache, as do temporary directories of a process that was killed mid-way (``.*.partial``, never mistaken for a
result). Needs a Python with :func:`tarfile.data_filter` (3.10.12, 3.11.4 or later). A leaf: it imports only
:mod:`inference_server.errors`.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import logging
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from inference_server.errors import InferenceServerError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["MAX_BYTES", "MAX_MEMBERS", "ArchiveError", "OutsideRoot", "confined", "model_directory", "unpack"]

logger = logging.getLogger("inference_server")

#: Default for the most bytes of files one archive may unpack to: 16 GiB is more than the models that share an instance
#: on a multi-model endpoint (a larger model is better served by an endpoint of its own), and bounds what one bad
#: archive can write to the instance's disk.
MAX_BYTES = 16 << 30
#: Default for the most members one archive may have: a model with its code and vocabulary files has hundreds, a
#: Python environment packed along with it tens of thousands; each costs an inode and a ``TarInfo`` in memory.
MAX_MEMBERS = 100_000

#: Part of the unpacked directory's name: change it when the layout or the checks change, so that a cache written by
#: another version is not reused.
_LAYOUT = "1"
_CHUNK = 1 << 20
#: Symbolic links followed in resolving one link's target, as Linux's ``MAXSYMLINKS``.
_MAX_FOLLOWS = 40
_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")
#: What reading a damaged archive raises (tarfile's own errors, and the decompressors' it lets through).
_CORRUPT = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)
#: The header errors that mean damage rather than the end of the archive (undocumented, in tarfile since 3.2).
_DAMAGED = (tarfile.InvalidHeaderError, tarfile.TruncatedHeaderError)  # type: ignore[attr-defined]
#: Most bytes of a pax or GNU long-name header, which tarfile reads whole into memory.
_MAX_HEADER = 1 << 20
_EXTENDED = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)

_DIRECTORY, _FILE, _SYMLINK = "directory", "file", "symbolic link"

Parts = tuple[str, ...]


class ArchiveError(InferenceServerError, ValueError):
    """A model archive, or a ``TargetModel`` naming one, is refused; the message names the archive, member and why."""


class OutsideRoot(ArchiveError):
    """A ``TargetModel`` leads out of the model root: absolute, by ``..``, or through a symbolic link."""


#: What stat raises for a path that names nothing: missing, through a file, a name too long to exist, a loop of links.
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP)


def unpack(
    archive: Path,
    cache: Path,
    *,
    max_bytes: int = MAX_BYTES,
    max_members: int = MAX_MEMBERS,
    label: str | None = None,
) -> Path:
    """The directory under ``cache`` that the tar archive ``archive`` unpacks to, unpacking it unless already there.

    Compression (gzip, bzip2, xz or none) is detected. Raises :class:`ArchiveError` for an archive that is not a tar,
    is damaged, has a member that is unsafe, or exceeds ``max_members`` members or ``max_bytes`` bytes of files; its
    message names the archive as ``label`` (default: its path).
    """
    resolved = Path(archive).resolve(strict=True)
    cache = Path(cache).resolve()
    shown = str(archive) if label is None else label
    with _open_regular(resolved, shown) as file:
        before = os.fstat(file.fileno())
        destination = cache / _directory_name(resolved, before)
        if destination.is_dir():
            return destination
        cache.mkdir(parents=True, exist_ok=True)
        with _locked(cache / f".{destination.name}.lock"):  # (the workers that ask at once: one unpacks)
            if destination.is_dir():
                return destination
            _unpack(file, shown, before, cache, destination, max_bytes=max_bytes, max_members=max_members)
    return destination


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (made if missing) while the block runs, then remove the file, so
    that the cache holds unpacked models only. A process that waited on a file removed meanwhile, and one that makes
    it anew, may then run at once: each looks for the result again first, so at worst a failed unpacking is tried
    twice, and the rename decides. Where there is no ``fcntl`` (Windows), no lock, with the same fallback."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(descriptor)  # (the lock goes with it)


def _unpack(
    file: IO[bytes],
    shown: str,
    before: os.stat_result,
    cache: Path,
    destination: Path,
    *,
    max_bytes: int,
    max_members: int,
) -> None:
    """Extract ``file`` into a temporary directory of ``cache``, then rename it to ``destination``."""
    partial = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".partial", dir=cache))
    try:
        _extract(file, shown, partial, max_bytes=max_bytes, max_members=max_members)
        after = os.fstat(file.fileno())
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise ArchiveError(f"{shown} changed while it was being unpacked")
        partial.chmod(0o755)
        try:
            os.rename(partial, destination)
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not destination.is_dir():
                raise
            # Another process unpacked the same archive first (no lock here): its copy is as good as ours.
            shutil.rmtree(partial, ignore_errors=True)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


#: The longest TargetModel a message repeats whole.
_SHOWN = 64


def model_directory(
    root: Path, target: str, cache: Path, *, max_bytes: int = MAX_BYTES, max_members: int = MAX_MEMBERS
) -> Path:
    """The model directory for the ``TargetModel`` value ``target``: ``root/target`` if it is a directory, else that
    file or ``root/target.tar.gz`` unpacked into ``cache`` (with the limits of :func:`unpack`).

    Raises :class:`OutsideRoot` for a target that leads out of ``root`` (absolute, ``..``, or through a symbolic
    link; the log says where), :class:`ArchiveError` for an archive refused, and :class:`FileNotFoundError` naming
    the names tried when there is no such model (also for a name too long to exist). No message names ``root``.
    """
    if not target or "\0" in target or target.startswith("/") or _escapes(target):
        raise OutsideRoot(f"TargetModel {target!r} is not a path inside the model root")
    names = [target] if target.endswith(_SUFFIXES) else [target, f"{target}.tar.gz"]
    inside = _resolve(root, target)
    for name in names:
        candidate = root / name
        real = _resolve(candidate, target)
        if real == inside or not real.is_relative_to(inside):
            logger.warning(
                "TargetModel %r refused: %s is %s, outside the model root %s", target, candidate, real, inside
            )
            raise OutsideRoot(f"TargetModel {target!r} leads out of the model root")
        try:
            mode = os.stat(real).st_mode
        except OSError as error:
            if error.errno in _ABSENT:
                continue
            raise ArchiveError(f"TargetModel {target!r}: {name} cannot be read ({error.strerror})") from None
        if stat.S_ISDIR(mode):
            return real
        if stat.S_ISREG(mode):
            return unpack(real, cache, max_bytes=max_bytes, max_members=max_members, label=name)
        raise ArchiveError(f"TargetModel {target!r}: {name} is neither a directory nor a file")
    if len(target) > _SHOWN:  # (a TargetModel may be 1,024 characters: say it once, cut)
        raise FileNotFoundError(f"no model {target[:_SHOWN]!r}... under the model root")
    raise FileNotFoundError(f"no model {target!r} under the model root: tried {' and '.join(names)}")


def confined(path: str, roots: Iterable[str]) -> str | None:
    """``path`` with its symbolic links resolved, if that is one of ``roots`` or lies inside one (each root resolved
    too; one that does not exist holds nothing), else None. A relative ``path`` starts at the working directory."""
    real = os.path.realpath(path)
    for root in roots:
        try:
            base = os.path.realpath(root, strict=True)
        except (OSError, ValueError):
            continue
        if os.path.commonpath([real, base]) == base:
            return real
    return None


def _resolve(path: Path, target: str) -> Path:
    """``path`` made absolute with its symbolic links followed; a loop of links is no model, as from Python 3.13
    (where ``stat`` then fails with ``ELOOP``), said without the path that :class:`RuntimeError` names."""
    try:
        return path.resolve()
    except RuntimeError:  # Python before 3.13 raises it for a loop of links
        raise FileNotFoundError(f"no model {target!r} under the model root: a loop of symbolic links") from None


def _open_regular(path: Path, archive: str) -> IO[bytes]:
    """``path`` opened for reading, unless it is not a regular file (a FIFO is refused without waiting for a writer)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ArchiveError(f"{archive} is not a regular file, so it cannot be a model archive")
    return open(descriptor, "rb")


def _escapes(path: str) -> bool:
    """Whether the relative ``path`` leads above its starting directory by its ``..`` components alone."""
    depth = 0
    for part in path.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _directory_name(resolved: Path, status: os.stat_result) -> str:
    """The cache directory's name for an archive: readable, and different whenever the archive changes."""
    key = f"{_LAYOUT}\0{resolved}\0{status.st_size}\0{status.st_mtime_ns}".encode(errors="surrogateescape")
    stem = resolved.name
    for suffix in _SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).lstrip(".")[:64] or "model"
    return f"{stem}-{hashlib.sha256(key).hexdigest()[:16]}"


def _extract(file: IO[bytes], archive: str, into: Path, *, max_bytes: int, max_members: int) -> None:
    """Check and write every member of the tar archive read from ``file`` into the empty directory ``into``."""
    tree = _Tree(archive, max_bytes, max_members)
    try:
        with _open(file, archive) as tar:
            for member in tar:
                path, kind = tree.add(member)
                if kind is not None:
                    _write(tar, member, into, path, tree)
            _drain(tar, max_bytes - tree.written, archive)
    except _Unsupported as error:
        raise ArchiveError(f"{archive} {error}") from None
    except tarfile.FilterError as error:  # its message names where the member would go: the log only has it
        logger.warning("%s: tarfile's data filter refused a member: %s", archive, error)
        raise tree.refuse(error.tarinfo, f"is refused by tarfile's data filter ({type(error).__name__})") from None
    except _CORRUPT as error:
        raise ArchiveError(f"{archive} is truncated or corrupt: {error}") from None
    tree.check_links()


def _open(file: IO[bytes], archive: str) -> tarfile.TarFile:
    """The tar archive read from ``file``, of whichever compression ``tarfile`` detects."""
    try:
        return tarfile.open(fileobj=file, mode="r:*", tarinfo=_Header)
    except _CORRUPT:
        raise ArchiveError(f"{archive} is not a tar archive (plain, or compressed with gzip, bzip2 or xz)") from None


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, into: Path, path: Parts, tree: _Tree) -> None:
    """Write the checked ``member`` at ``path`` under ``into``, through :func:`tarfile.data_filter` once more."""
    mode = tarfile.data_filter(member, str(into)).mode
    target = into.joinpath(*path)
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if member.issym():
        os.symlink(member.linkname, target)
    elif member.islnk():
        os.link(into.joinpath(*tree.hard_link_source(member)), target, follow_symlinks=False)
    else:
        source = tar.extractfile(member)
        if source is None:  # pragma: no cover - tarfile returns a reader for every regular member
            raise tree.refuse(member, "has no data")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with source, open(os.open(target, flags, 0o600), "wb") as out:
            written = 0
            while chunk := source.read(_CHUNK):
                written += len(chunk)
                tree.written += len(chunk)
                if written > member.size:
                    raise tree.refuse(member, f"holds more than the {member.size} bytes its header declares")
                out.write(chunk)
            os.fchmod(out.fileno(), 0o644 if mode is None else mode)


def _drain(tar: tarfile.TarFile, limit: int, archive: str) -> None:
    """Read what follows the end of the tar, so that a gzip stream's checksum and length are verified."""
    allowed = max(limit, _CHUNK)
    left = allowed
    while chunk := tar.fileobj.read(_CHUNK):
        left -= len(chunk)
        if left < 0:
            raise ArchiveError(f"{archive} goes on for more than {allowed} bytes after the end of its tar archive")


class _Unsupported(Exception):
    """A header that tarfile would read but this module refuses; :func:`_extract` names the archive."""


class _Header(tarfile.TarInfo):
    """A header read as tarfile reads it, refusing what tarfile lets pass: a damaged header after the first (tarfile
    takes it for the end of the archive, and the model would load half unpacked), an extended header too large to hold
    in memory, and an old GNU sparse member (tarfile reads its map into memory block by block)."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(tar)
        except _DAMAGED as error:
            if tar.offset == 0:  # not a header at all: tarfile.open goes on to try the next compression
                raise
            raise tarfile.ReadError(f"damaged header at byte {tar.offset} of the tar stream ({error})") from None

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        header = super().frombuf(buf, encoding, errors)
        if header.type in _EXTENDED and header.size > _MAX_HEADER:
            raise _Unsupported(f"has an extended header of {header.size} bytes, more than the limit of {_MAX_HEADER}")
        if header.type == tarfile.GNUTYPE_SPARSE:
            raise _Unsupported(f"has a sparse member {header.name!r} (old GNU format), which is not supported")
        return header


class _Tree:
    """What an archive has put where so far, for the checks that depend on earlier members."""

    def __init__(self, archive: str, max_bytes: int, max_members: int) -> None:
        self.archive = archive
        self.max_bytes = max_bytes
        self.max_members = max_members
        self.kinds: dict[Parts, str] = {(): _DIRECTORY}
        #: Each symbolic link's path, with its member (for messages) and target.
        self.links: dict[Parts, tarfile.TarInfo] = {}
        self.members = 0
        self.declared = 0
        self.written = 0

    def refuse(self, member: tarfile.TarInfo, problem: str) -> ArchiveError:
        """The error for a member that is refused."""
        return ArchiveError(f"{self.archive}: member {member.name!r} {problem}")

    def add(self, member: tarfile.TarInfo) -> tuple[Parts, str | None]:
        """Check ``member`` against the limits and what came before; its normalised path and kind (None: nothing to
        write, the archive's own directory)."""
        self.members += 1
        if self.members > self.max_members:
            raise self.refuse(member, f"is one more than the limit of {self.max_members} members")
        kind = self._kind(member)
        path = self._walk(member, member.name, "path")
        if not path:
            if kind == _DIRECTORY:
                return path, None
            raise self.refuse(member, f"is a {kind} in place of the archive's directory itself")
        existing = self.kinds.get(path)
        if existing is not None and not (existing == kind == _DIRECTORY):
            raise self.refuse(member, f"is a {kind} where the archive already has a {existing}")
        if member.issym():
            if not member.linkname:
                raise self.refuse(member, "is a symbolic link with an empty target")
            if member.linkname.startswith("/"):
                raise self.refuse(member, f"is a symbolic link to the absolute path {member.linkname!r}")
            self.links[path] = member
            self._check_link(path, member)
        elif member.islnk():
            self.hard_link_source(member)
        elif member.isreg():
            self.declared += member.size
            if self.declared > self.max_bytes:
                raise self.refuse(
                    member,
                    f"declares {member.size} bytes, bringing the archive to {self.declared}, "
                    f"more than the limit of {self.max_bytes}",
                )
        for depth in range(1, len(path)):
            self.kinds.setdefault(path[:depth], _DIRECTORY)
        self.kinds[path] = kind
        return path, kind

    def hard_link_source(self, member: tarfile.TarInfo) -> Parts:
        """The path of the earlier file that the hard link ``member`` names (relative to the archive's directory)."""
        if member.linkname.startswith("/"):
            raise self.refuse(member, f"is a hard link to the absolute path {member.linkname!r}")
        source = self._walk(member, member.linkname, "hard link target")
        if self.kinds.get(source) != _FILE:
            raise self.refuse(member, f"is a hard link to {member.linkname!r}, which is not an earlier file of it")
        return source

    def check_links(self) -> None:
        """Check every symbolic link again, now that the archive's other links are all known."""
        for path, member in self.links.items():
            self._check_link(path, member)

    def _check_link(self, path: Parts, member: tarfile.TarInfo) -> None:
        """Refuse the symbolic link ``member`` at ``path`` if its target, followed through the links known so far,
        leads out of the archive."""
        follows = 0
        parts = list(path[:-1])
        pending = member.linkname.split("/")[::-1]
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    raise self.refuse(
                        member, f"is a symbolic link to {member.linkname!r}, which leads out of the archive"
                    )
                parts.pop()
                continue
            parts.append(part)
            link = self.links.get(tuple(parts))
            if link is not None:
                follows += 1
                if follows > _MAX_FOLLOWS:
                    raise self.refuse(
                        member, f"is a symbolic link to {member.linkname!r}, through more than {_MAX_FOLLOWS} links"
                    )
                parts.pop()
                pending.extend(link.linkname.split("/")[::-1])

    def _kind(self, member: tarfile.TarInfo) -> str:
        """The member's kind, if it is one that may be unpacked."""
        if member.isreg() or member.islnk():
            return _FILE
        if member.isdir():
            return _DIRECTORY
        if member.issym():
            return _SYMLINK
        if member.ischr():
            raise self.refuse(member, "is a character device")
        if member.isblk():
            raise self.refuse(member, "is a block device")
        if member.isfifo():
            raise self.refuse(member, "is a FIFO (named pipe)")
        raise self.refuse(member, f"has type {member.type!r}, which is not a file, directory or link")

    def _walk(self, member: tarfile.TarInfo, name: str, role: str) -> Parts:
        """``name`` normalised to its components, refused if it is absolute, leads out of the archive's directory, or
        passes through a symbolic link or a file."""
        if name.startswith("/"):
            raise self.refuse(member, f"has an absolute {role}")
        parts: list[str] = []
        for part in name.split("/"):
            if part in ("", "."):
                continue
            kind = self.kinds.get(tuple(parts))
            if kind is not None and kind != _DIRECTORY:
                raise self.refuse(member, f"has a {role} {name!r} through the {kind} {'/'.join(parts)!r}")
            if part != "..":
                parts.append(part)
            elif parts:
                parts.pop()
            else:
                raise self.refuse(member, f"has a {role} {name!r} that leads out of the archive's directory")
        return tuple(parts)
