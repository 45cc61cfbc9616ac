"""Model archives unpacked into the cache: a real model.tar.gz, each hostile member refused, races between processes."""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from inference_server import _archive
from inference_server._archive import ArchiveError, OutsideRoot, confined, model_directory, unpack

Member = tuple[tarfile.TarInfo, bytes]


def _member(name: str, data: bytes = b"", *, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info, data


def _file(name: str, data: bytes = b"data") -> Member:
    return _member(name, data)


def _dir(name: str) -> Member:
    return _member(name, kind=tarfile.DIRTYPE)


def _symlink(name: str, target: str) -> Member:
    return _member(name, kind=tarfile.SYMTYPE, linkname=target)


def _hardlink(name: str, target: str) -> Member:
    return _member(name, kind=tarfile.LNKTYPE, linkname=target)


def _tar(path: Path, members: Iterable[Member], mode: str = "w:gz") -> Path:
    """Write ``members`` to the tar archive ``path`` (gzip-compressed unless ``mode`` says otherwise)."""
    with tarfile.open(path, mode) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _model_tree(path: Path) -> Path:
    """A model directory as a training job leaves it: nested code and weights, a script, a relative symlink."""
    (path / "code" / "lib").mkdir(parents=True)
    (path / "weights").mkdir()
    (path / "code" / "inference.py").write_text("def model_fn(model_dir):\n    return model_dir\n")
    (path / "code" / "lib" / "__init__.py").write_text("")
    (path / "code" / "serve.sh").write_text("#!/bin/sh\n")
    (path / "code" / "serve.sh").chmod(0o755)
    (path / "weights" / "model.bin").write_bytes(os.urandom(300_000))
    (path / "weights" / "vocab.txt").write_text("a\nb\nc\n")
    os.symlink("../weights/model.bin", path / "code" / "model.bin")
    return path


def _packed(source: Path, archive: Path, mode: str = "w:gz") -> Path:
    with tarfile.open(archive, mode) as tar:
        tar.add(source, arcname=".")
    return archive


def _listing(path: Path) -> dict[str, Any]:
    """Every entry under ``path``: a file's bytes, a link's target, or None for a directory."""
    entries: dict[str, Any] = {}
    for entry in sorted(path.rglob("*")):
        name = str(entry.relative_to(path))
        if entry.is_symlink():
            entries[name] = ("link", os.readlink(entry))
        elif entry.is_dir():
            entries[name] = None
        else:
            entries[name] = entry.read_bytes()
    return entries


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """The cache directory, not yet made: unpack makes it."""
    return tmp_path / "cache"


@pytest.mark.parametrize(
    ("name", "mode"), [("model.tar.gz", "w:gz"), ("model.tgz", "w:gz"), ("model.tar", "w"), ("model", "w:bz2")]
)
def test_a_model_archive_unpacks_with_its_bytes_links_and_modes(
    tmp_path: Path, cache: Path, name: str, mode: str
) -> None:
    """A model archive (any compression, any name) unpacks to the same tree: bytes, relative link, executable bit."""
    source = _model_tree(tmp_path / "source")
    unpacked = unpack(_packed(source, tmp_path / name, mode), cache)
    assert unpacked.parent == cache
    assert _listing(unpacked) == _listing(source)
    assert (unpacked / "code" / "model.bin").read_bytes() == (source / "weights" / "model.bin").read_bytes()
    assert os.access(unpacked / "code" / "serve.sh", os.X_OK)
    assert not os.access(unpacked / "weights" / "vocab.txt", os.X_OK)
    assert [entry.name for entry in cache.iterdir()] == [unpacked.name]


def test_a_hard_link_to_an_earlier_file_unpacks_as_the_same_file(tmp_path: Path, cache: Path) -> None:
    """A hard link to an earlier member unpacks as a second name of that file."""
    archive = _tar(tmp_path / "model.tar.gz", [_file("weights/a.bin", b"weights"), _hardlink("b.bin", "weights/a.bin")])
    unpacked = unpack(archive, cache)
    assert (unpacked / "b.bin").read_bytes() == b"weights"
    assert (unpacked / "b.bin").stat().st_ino == (unpacked / "weights" / "a.bin").stat().st_ino


HOSTILE = [
    pytest.param([_file("../evil")], "'../evil' has a path '../evil' that leads out", id="dot-dot"),
    pytest.param(
        [_file("model/../../evil")],
        "'model/../../evil' has a path 'model/../../evil' that leads out",
        id="dot-dot-deep",
    ),
    pytest.param([_file("/tmp/inference-server-evil")], "'/tmp/inference-server-evil' has an absolute path", id="abs"),
    pytest.param(
        [_symlink("link", "../../outside")],
        "'link' is a symbolic link to '../../outside', which leads out",
        id="symlink",
    ),
    pytest.param(
        [_symlink("link", "/etc/passwd")], "'link' is a symbolic link to the absolute path '/etc/passwd'", id="abs-link"
    ),
    pytest.param(
        [_symlink("q", "p/p/p/.."), _symlink("p", ".")],
        "'q' is a symbolic link to 'p/p/p/..', which leads out",
        id="symlink-through-a-later-symlink",
    ),
    pytest.param(
        [_symlink("a", "b"), _symlink("b", "a")],
        "'b' is a symbolic link to 'a', through more than 40 links",
        id="link-loop",
    ),
    pytest.param(
        [_dir("sub"), _symlink("link", "sub"), _file("link/x")],
        "'link/x' has a path 'link/x' through the symbolic link 'link'",
        id="write-through-symlink",
    ),
    pytest.param(
        [_symlink("link", "."), _file("link/../x")],
        "'link/../x' has a path 'link/../x' through the symbolic link 'link'",
        id="dot-dot-through-symlink",
    ),
    pytest.param(
        [_file("d/x"), _symlink("d", ".")],
        "'d' is a symbolic link where the archive already has a directory",
        id="symlink-replaces-directory",
    ),
    pytest.param(
        [_symlink("a", "b"), _file("a")], "'a' is a file where the archive already has a symbolic link", id="duplicate"
    ),
    pytest.param([_file("f"), _file("f/x")], "'f/x' has a path 'f/x' through the file 'f'", id="inside-a-file"),
    pytest.param(
        [_hardlink("link", "../outside")], "'link' has a hard link target '../outside' that leads out", id="hardlink"
    ),
    pytest.param(
        [_hardlink("link", "/etc/passwd")],
        "'link' is a hard link to the absolute path '/etc/passwd'",
        id="abs-hardlink",
    ),
    pytest.param(
        [_hardlink("link", "missing")],
        "'link' is a hard link to 'missing', which is not an earlier file",
        id="hardlink-to-nothing",
    ),
    pytest.param([_member("null", kind=tarfile.CHRTYPE)], "'null' is a character device", id="chr"),
    pytest.param([_member("sda", kind=tarfile.BLKTYPE)], "'sda' is a block device", id="blk"),
    pytest.param([_member("pipe", kind=tarfile.FIFOTYPE)], "'pipe' is a FIFO", id="fifo"),
    pytest.param(
        [_member("volume", kind=b"V")], "'volume' has type b'V', which is not a file, directory or link", id="other"
    ),
    pytest.param([_file(".")], "'.' is a file in place of the archive's directory", id="file-as-root"),
    pytest.param([_symlink("empty", "")], "'empty' is a symbolic link with an empty target", id="empty-link"),
]


@pytest.mark.parametrize(("members", "message"), HOSTILE)
def test_a_hostile_member_is_refused_by_name_and_leaves_nothing(
    tmp_path: Path, cache: Path, members: list[Member], message: str
) -> None:
    """Each unsafe member is refused with the archive, the member and the reason; nothing is left in the cache."""
    archive = _tar(tmp_path / "model.tar.gz", [_file("code/inference.py"), *members])
    with pytest.raises(ArchiveError, match=re.escape("model.tar.gz: member ")) as refused:
        unpack(archive, cache)
    assert str(archive) in str(refused.value)
    assert message in str(refused.value)
    assert list(cache.iterdir()) == []
    assert not (tmp_path / "evil").exists()
    assert not Path("/tmp/inference-server-evil").exists()


def test_the_data_filter_refuses_what_our_own_checks_would_miss(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tarfile's data filter is a second line of defence: without our link check, it still refuses a link out, the
    refusal naming the filter's error but not where the link would lead, which its message names."""
    monkeypatch.setattr(_archive._Tree, "_check_link", lambda self, path, member: None)
    archive = _tar(tmp_path / "model.tar.gz", [_symlink("link", "../../outside")])
    with pytest.raises(ArchiveError, match="member 'link' is refused by tarfile's data filter") as refused:
        unpack(archive, cache)
    assert list(cache.iterdir()) == []
    assert "would link to" not in str(refused.value)  # (where the link would lead: in the log only)


def test_more_members_than_the_limit_are_refused(tmp_path: Path, cache: Path) -> None:
    """The member past ``max_members`` is refused, and nothing is left."""
    archive = _tar(tmp_path / "model.tar.gz", [_file(f"f{index}") for index in range(4)])
    assert unpack(archive, tmp_path / "roomy", max_members=4).is_dir()
    with pytest.raises(ArchiveError, match="member 'f3' is one more than the limit of 3 members"):
        unpack(archive, cache, max_members=3)
    assert list(cache.iterdir()) == []


def test_declared_bytes_over_the_limit_are_refused_before_writing(tmp_path: Path, cache: Path) -> None:
    """Files whose declared sizes add up past ``max_bytes`` are refused at the header that crosses the limit."""
    archive = _tar(tmp_path / "model.tar.gz", [_file("a", b"x" * 60), _file("b", b"y" * 41)])
    assert unpack(archive, tmp_path / "roomy", max_bytes=101).is_dir()
    with pytest.raises(ArchiveError, match="member 'b' declares 41 bytes, bringing the archive to 101, more than the "):
        unpack(archive, cache, max_bytes=100)
    assert list(cache.iterdir()) == []


def test_a_member_yielding_more_than_its_header_declares_is_refused(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes written are counted: a member whose data runs past its declared size is refused mid-write."""
    archive = _tar(tmp_path / "model.tar.gz", [_file("weights.bin", b"x" * 10)])
    monkeypatch.setattr(tarfile.TarFile, "extractfile", lambda self, member: io.BytesIO(b"x" * 5_000_000))
    with pytest.raises(
        ArchiveError, match=re.escape("member 'weights.bin' holds more than the 10 bytes its header declares")
    ):
        unpack(archive, cache)
    assert list(cache.iterdir()) == []


def test_a_header_declaring_more_than_the_archive_holds_is_refused(tmp_path: Path, cache: Path) -> None:
    """A header that lies about its size (more than the archive holds) is refused as truncated."""
    info = tarfile.TarInfo("weights.bin")
    info.size = 1_000_000
    (tmp_path / "model.tar.gz").write_bytes(gzip.compress(info.tobuf() + b"x" * 1024))
    with pytest.raises(ArchiveError, match=re.escape("model.tar.gz is truncated or corrupt")):
        unpack(tmp_path / "model.tar.gz", cache)
    assert list(cache.iterdir()) == []


def test_a_damaged_header_after_the_first_is_refused_not_taken_for_the_end(tmp_path: Path, cache: Path) -> None:
    """A damaged second header is refused, where tarfile alone would end the archive there and load half a model."""
    plain = _tar(tmp_path / "model.tar", [_file("a", b"a" * 10), _file("b", b"b" * 10)], mode="w")
    data = bytearray(plain.read_bytes())
    data[1024 + 148 : 1024 + 156] = b"0000000\0"  # the second header's checksum
    plain.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match=r"model.tar is truncated or corrupt: damaged header at byte 1024"):
        unpack(plain, cache)
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize(
    ("content", "name"),
    [
        (b"not a tar archive\n" * 100, "model.tar.gz"),
        (b"", "model.tar.gz"),
        (gzip.compress(b"{'a': 1}" * 200), "model.tar.gz"),
        (b"PK\x03\x04" + bytes(600), "model.zip"),
    ],
    ids=["text", "empty", "gzipped-text", "zip"],
)
def test_a_file_that_is_not_a_tar_archive_is_refused_clearly(
    tmp_path: Path, cache: Path, content: bytes, name: str
) -> None:
    """A file that is not a tar archive (plain or compressed) says so."""
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ArchiveError, match=f"{name} is not a tar archive"):
        unpack(tmp_path / name, cache)
    assert list(cache.iterdir()) == []


def test_a_truncated_tar_gz_is_refused(tmp_path: Path, cache: Path) -> None:
    """A .tar.gz cut short (an interrupted download) is refused, and what it had written is removed."""
    archive = _packed(_model_tree(tmp_path / "model"), tmp_path / "model.tar.gz")
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
    with pytest.raises(ArchiveError, match=re.escape("model.tar.gz is truncated or corrupt")):
        unpack(archive, cache)
    assert list(cache.iterdir()) == []


def test_a_gzip_checksum_mismatch_is_refused(tmp_path: Path, cache: Path) -> None:
    """A .tar.gz whose gzip checksum does not match (a corrupted model) is refused, though every tar header reads."""
    archive = _tar(tmp_path / "model.tar.gz", [_file("weights.bin", b"w" * 1000)])
    data = bytearray(archive.read_bytes())
    data[-8] ^= 0xFF  # the CRC-32 of the uncompressed stream
    archive.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match=re.escape("model.tar.gz is truncated or corrupt: CRC check failed")):
        unpack(archive, cache)
    assert list(cache.iterdir()) == []


def test_a_stream_going_on_past_the_end_of_the_tar_is_cut_off(tmp_path: Path, cache: Path) -> None:
    """What follows the end of the tar is read only up to the byte limit (a gzip bomb of padding is refused)."""
    body = _tar(tmp_path / "model.tar", [_file("a", b"a" * 10)], mode="w").read_bytes()
    (tmp_path / "model.tar.gz").write_bytes(gzip.compress(body + bytes(3 << 20)))
    with pytest.raises(ArchiveError, match="goes on for more than 1048576 bytes after the end of its tar archive"):
        unpack(tmp_path / "model.tar.gz", cache, max_bytes=1000)
    assert list(cache.iterdir()) == []
    assert (unpack(tmp_path / "model.tar.gz", cache) / "a").read_bytes() == b"a" * 10


def test_an_oversized_extended_header_is_refused_before_tarfile_reads_it(tmp_path: Path, cache: Path) -> None:
    """A pax header larger than 1 MiB (which tarfile would read whole into memory) is refused."""
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = 2 << 20
    (tmp_path / "model.tar").write_bytes(pax.tobuf() + bytes(2 << 20))
    with pytest.raises(
        ArchiveError, match=re.escape("model.tar has an extended header of 2097152 bytes, more than the limit")
    ):
        unpack(tmp_path / "model.tar", cache)
    assert list(cache.iterdir()) == []


def test_an_old_gnu_sparse_member_is_refused(tmp_path: Path, cache: Path) -> None:
    """An old-GNU sparse member (whose map tarfile reads into memory block by block) is refused."""
    sparse = tarfile.TarInfo("weights.bin")
    sparse.type = tarfile.GNUTYPE_SPARSE
    (tmp_path / "model.tar").write_bytes(sparse.tobuf(tarfile.GNU_FORMAT) + bytes(1024))
    with pytest.raises(ArchiveError, match=re.escape("model.tar has a sparse member 'weights.bin'")):
        unpack(tmp_path / "model.tar", cache)
    assert list(cache.iterdir()) == []


def test_an_archive_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path, cache: Path) -> None:
    """A FIFO or a directory in place of an archive is refused at once (opening a FIFO must not wait for a writer)."""
    os.mkfifo(tmp_path / "model.tar.gz")
    with pytest.raises(ArchiveError, match=re.escape("model.tar.gz is not a regular file")):
        unpack(tmp_path / "model.tar.gz", cache)
    with pytest.raises(ArchiveError, match="is not a regular file"):
        unpack(tmp_path, cache)
    assert not cache.exists()


def test_a_missing_archive_raises_file_not_found(tmp_path: Path, cache: Path) -> None:
    """A missing archive raises FileNotFoundError naming it."""
    with pytest.raises(FileNotFoundError, match=re.escape("missing.tar.gz")):
        unpack(tmp_path / "missing.tar.gz", cache)


def test_a_second_call_returns_the_unpacked_directory_without_unpacking(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unpacking the same archive again returns the same directory, untouched (same inodes), without extracting."""
    archive = _packed(_model_tree(tmp_path / "model"), tmp_path / "model.tar.gz")
    first = unpack(archive, cache)
    before = (first.stat().st_ino, (first / "weights" / "model.bin").stat().st_ino)

    def extract(*args: object, **kwargs: object) -> None:
        raise AssertionError("unpacked again")

    monkeypatch.setattr(_archive, "_extract", extract)
    second = unpack(tmp_path / "model" / ".." / "model.tar.gz", cache)
    assert second == first
    assert (second.stat().st_ino, (second / "weights" / "model.bin").stat().st_ino) == before


def test_a_changed_archive_unpacks_anew(tmp_path: Path, cache: Path) -> None:
    """An archive rewritten (new modification time) unpacks to a new directory with its new contents."""
    archive = _tar(tmp_path / "model.tar.gz", [_file("version.txt", b"1")])
    first = unpack(archive, cache)
    _tar(archive, [_file("version.txt", b"2")])
    os.utime(archive, ns=(archive.stat().st_atime_ns, first.stat().st_mtime_ns + 10**9))
    second = unpack(archive, cache)
    assert second != first
    assert (first / "version.txt").read_bytes() == b"1"
    assert (second / "version.txt").read_bytes() == b"2"


def test_an_archive_changed_while_unpacking_is_refused(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archive rewritten while it is being unpacked is refused, not cached under its old name."""
    archive = _tar(tmp_path / "model.tar.gz", [_file("version.txt", b"1")])
    extract = _archive._extract

    def extract_while_the_archive_changes(file: Any, archive: Path, into: Path, **limits: int) -> None:
        extract(file, archive, into, **limits)
        os.utime(archive, ns=(0, 10**9))

    monkeypatch.setattr(_archive, "_extract", extract_while_the_archive_changes)
    with pytest.raises(ArchiveError, match=re.escape("model.tar.gz changed while it was being unpacked")):
        unpack(archive, cache)
    assert list(cache.iterdir()) == []


def test_losing_the_race_to_rename_returns_the_winners_directory(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When another process renames its copy into place first, ours is discarded and the winner's returned."""
    archive = _tar(tmp_path / "model.tar.gz", [_file("code/inference.py", b"pass")])
    winner = cache / unpack(archive, tmp_path / "elsewhere").name
    extract = _archive._extract
    inodes = []

    def extract_while_another_process_wins(file: Any, archive: Path, into: Path, **limits: int) -> None:
        extract(file, archive, into, **limits)
        shutil.copytree(into, winner)
        inodes.append(winner.stat().st_ino)

    monkeypatch.setattr(_archive, "_extract", extract_while_another_process_wins)
    assert unpack(archive, cache) == winner
    assert [entry.name for entry in cache.iterdir()] == [winner.name]
    assert [winner.stat().st_ino] == inodes
    assert (winner / "code" / "inference.py").read_bytes() == b"pass"


UNPACKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from inference_server import _archive
    from inference_server._archive import unpack

    extract = _archive._extract

    def counted(*args, **kwargs):  # (the real extraction, said on stderr)
        print("extracting", file=sys.stderr, flush=True)
        return extract(*args, **kwargs)

    _archive._extract = counted
    archive, cache, ready, go = map(Path, sys.argv[1:])
    ready.touch()
    deadline = time.monotonic() + 30
    while not go.exists():
        if time.monotonic() > deadline:
            sys.exit("never told to go")
        time.sleep(0.001)
    print(unpack(archive, cache))
    """
)


def test_processes_unpacking_the_same_archive_at_once_share_one_copy(tmp_path: Path, cache: Path) -> None:
    """Four processes unpacking one archive at the same moment all get the same directory, one of them extracts it
    (the others wait for it), and one copy is left."""
    files = [_file(f"weights/{index:03}.bin", os.urandom(64 << 10)) for index in range(200)]
    archive = _tar(tmp_path / "model.tar.gz", files)
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{index}" for index in range(4)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", UNPACKER, str(archive), str(cache), str(flag), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flag in ready
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(flag.exists() for flag in ready):
            assert time.monotonic() < deadline, "the unpacking processes did not start"
            time.sleep(0.01)
        go.touch()
        results = [process.communicate(timeout=60) for process in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait()
    assert [process.returncode for process in processes] == [0] * 4, [error for _, error in results]
    assert len({output.strip() for output, _ in results}) == 1
    assert sum(error.count("extracting") for _, error in results) == 1
    unpacked = Path(results[0][0].strip())
    assert [entry.name for entry in cache.iterdir()] == [unpacked.name]
    assert len(list((unpacked / "weights").iterdir())) == 200


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A model root as a multi-model endpoint sees it: a directory, tarballs with and without suffix, in a subfolder."""
    root = tmp_path / "models"
    _model_tree(root / "model-c")
    (root / "team").mkdir()
    _tar(root / "model-a.tar.gz", [_file("name.txt", b"a")])
    _tar(root / "team" / "model-b.tar.gz", [_file("name.txt", b"b")])
    _tar(root / "model-d", [_file("name.txt", b"d")])
    os.symlink("model-c", root / "alias")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "name.txt").write_text("outside")
    _tar(tmp_path / "elsewhere.tar.gz", [_file("name.txt", b"outside")])
    os.symlink(tmp_path / "elsewhere", root / "out")
    os.symlink("../elsewhere.tar.gz", root / "out-archive.tar.gz")
    return root


def test_a_target_directory_is_returned_as_it_is(root: Path, cache: Path) -> None:
    """A target that is a directory (or a link to one inside the root) is the model directory, nothing unpacked."""
    assert model_directory(root, "model-c", cache) == root / "model-c"
    assert model_directory(root, "alias", cache) == root / "model-c"
    assert not cache.exists()


@pytest.mark.parametrize(
    ("target", "name"),
    [("model-a.tar.gz", b"a"), ("team/model-b", b"b"), ("team/model-b.tar.gz", b"b"), ("model-d", b"d")],
)
def test_a_target_archive_is_unpacked_into_the_cache(root: Path, cache: Path, target: str, name: bytes) -> None:
    """A target naming a tarball, with or without its .tar.gz, is unpacked into the cache."""
    directory = model_directory(root, target, cache)
    assert directory.parent == cache
    assert (directory / "name.txt").read_bytes() == name


def test_a_long_missing_target_is_named_once_and_cut(root: Path, cache: Path) -> None:
    """A missing target of 1,000 characters is named once, cut to 64 (an answer wrapped in SageMaker's 424 repeats
    the message: it stayed 2 KB with the target three times)."""
    with pytest.raises(FileNotFoundError) as missing:
        _archive.model_directory(root, "a" * 1000, cache)
    assert str(missing.value) == f"no model {'a' * 64!r}... under the model root"


def test_a_missing_target_names_the_names_tried_but_not_the_root(root: Path, cache: Path) -> None:
    """A target that is not there raises FileNotFoundError naming both names tried, relative to the root, which it
    does not name (an answer would show it to the client)."""
    with pytest.raises(FileNotFoundError) as missing:
        model_directory(root, "team/model-x", cache)
    assert "tried team/model-x and team/model-x.tar.gz" in str(missing.value)
    assert str(root.parent) not in str(missing.value)


@pytest.mark.parametrize("target", ["a" * 255, "a" * 300, "a/" * 600, "model-c/" + "b" * 1000, "%2e%2e"])
def test_a_target_too_long_to_exist_is_not_found_never_an_os_error(root: Path, cache: Path, target: str) -> None:
    """A target with a name of 255 bytes or more (its .tar.gz one longer still), or a path deeper than any there,
    is not found (before: OSError, File name too long, from is_dir)."""
    with pytest.raises(FileNotFoundError, match="no model"):
        model_directory(root, target, cache)


def test_a_hostile_archive_named_by_a_target_is_refused_naming_no_directory(root: Path, cache: Path) -> None:
    """An archive's refusal through a target names the archive as the target does, not by its absolute path."""
    _tar(root / "evil.tar.gz", [_file("ok"), _file("../escaped")])
    with pytest.raises(ArchiveError, match=re.escape("evil.tar.gz: member '../escaped'")) as refused:
        model_directory(root, "evil", cache)
    assert str(root.parent) not in str(refused.value)


def test_a_target_that_is_neither_a_directory_nor_a_file_is_refused(root: Path, cache: Path) -> None:
    """A target that is a FIFO is refused, not opened; a loop of links is not found (as Python 3.13 has it), said
    without the root's path (Python 3.11's RuntimeError names it)."""
    os.mkfifo(root / "pipe")
    os.symlink("loop", root / "loop")
    with pytest.raises(ArchiveError, match=r"'pipe'.* is neither a directory nor a file"):
        model_directory(root, "pipe", cache)
    with pytest.raises(FileNotFoundError, match="loop") as loop:
        model_directory(root, "loop", cache)
    assert str(root.parent) not in str(loop.value)


@pytest.mark.parametrize(
    "target",
    ["../elsewhere", "/etc", "team/../../elsewhere", "", ".", "team/..", "out", "out/name.txt", "out-archive", "a\0b"],
)
def test_a_target_leading_out_of_the_root_is_refused(
    root: Path, cache: Path, target: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A target that is absolute, climbs out with .., names the root itself, or follows a link out, is refused as
    outside the root, naming neither the root nor where a link leads; the log says where it led."""
    with pytest.raises(OutsideRoot, match="TargetModel") as refused:
        model_directory(root, target, cache)
    assert str(root.parent) not in str(refused.value)
    assert not cache.exists()
    if target.startswith("out"):
        assert str(root.parent / "elsewhere") in caplog.text


def test_confined_resolves_links_and_roots_before_comparing(tmp_path: Path) -> None:
    """A path is inside a root after both are resolved: a root that is a link holds its target's contents, a link
    out of a root is outside, a sibling whose name extends the root's is outside, /proc/self/root leads back to /,
    a root that does not exist holds nothing, and a relative path starts at the working directory."""
    (tmp_path / "real" / "m").mkdir(parents=True)
    (tmp_path / "allowed" / "m").mkdir(parents=True)
    (tmp_path / "allowed-evil").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "linked")
    os.symlink(tmp_path / "allowed-evil", tmp_path / "allowed" / "out")
    roots = [str(tmp_path / "linked"), str(tmp_path / "allowed"), str(tmp_path / "missing")]
    real_m = str(tmp_path / "real" / "m")
    assert confined(str(tmp_path / "linked" / "m"), roots) == real_m
    assert confined(real_m, roots) == real_m
    assert confined(str(tmp_path / "allowed"), roots) == str(tmp_path / "allowed")
    assert confined(str(tmp_path / "allowed" / "m" / ".." / "m"), roots) == str(tmp_path / "allowed" / "m")
    for outside in ["allowed-evil", "allowed/out", "allowed/../allowed-evil", "linked/..", "missing/m", "."]:
        assert confined(str(tmp_path / outside), roots) is None, outside
    assert confined(f"/proc/self/root{tmp_path}/allowed/m", roots) == str(tmp_path / "allowed" / "m")
    assert confined("/proc/self/root/etc", roots) is None
    assert confined("m", [str(tmp_path / "allowed")]) is None
    assert confined("/" + "a" * 5000, roots) is None
