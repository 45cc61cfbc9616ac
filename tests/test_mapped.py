"""``inference_server.mapped``: model files' arrays memory-mapped and read-only (``.npy``, ``.npz``, safetensors), so
that the workers loading one file share its pages; what cannot be mapped is read, and nothing is unpickled."""

from __future__ import annotations

import io
import json
import logging
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

import inference_server
from inference_server._mapped import mapped
from tests.conftest import ServerFactory, smaps_rollup, wait_until

MIB = 1 << 20


def _arrays() -> dict[str, np.ndarray]:
    return {
        "weights": np.arange(12, dtype=np.float32).reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
        "empty": np.zeros((0, 5), dtype=np.float64),
        "flags": np.array([True, False, True]),
    }


def _same(found: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert found.keys() == expected.keys()
    for name, array in expected.items():
        assert found[name].dtype == array.dtype, name
        np.testing.assert_array_equal(found[name], array)


def test_an_npy_file_is_mapped_read_only(tmp_path: Path) -> None:
    """An .npy file: a read-only np.memmap of the file, equal to what was saved; a write raises."""
    np.save(tmp_path / "w.npy", np.arange(10.0))
    array = inference_server.mapped(tmp_path / "w.npy")
    assert isinstance(array, np.memmap)
    np.testing.assert_array_equal(array, np.arange(10.0))
    with pytest.raises(ValueError, match="read-only"):
        array[0] = 1.0


def test_an_uncompressed_npz_maps_every_member(tmp_path: Path) -> None:
    """numpy.savez: each member mapped where its bytes lie (Fortran order, empty and boolean arrays too)."""
    expected = _arrays()
    np.savez(tmp_path / "model.npz", **expected)
    found = mapped(str(tmp_path / "model.npz"))
    _same(found, expected)
    assert all(isinstance(found[name], np.memmap) for name in ("weights", "fortran", "flags"))
    assert found["fortran"].flags.f_contiguous


def test_a_compressed_npz_is_read_with_a_debug_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """numpy.savez_compressed: its members cannot be mapped, so they are read into memory, and a DEBUG line says so."""
    expected = _arrays()
    np.savez_compressed(tmp_path / "model.npz", **expected)
    with caplog.at_level(logging.DEBUG, logger="inference_server"):
        found = mapped(tmp_path / "model.npz")
    _same(found, expected)
    assert not any(isinstance(array, np.memmap) for array in found.values())
    assert "weights.npy cannot be mapped (it is compressed, or its .npy header is of version 3)" in caplog.text


def test_a_safetensors_file_maps_every_tensor(tmp_path: Path) -> None:
    """A file written by safetensors: each tensor a read-only view of one mapping of the file."""
    expected = {name: np.ascontiguousarray(array) for name, array in _arrays().items()}
    safetensors.numpy.save_file(expected, str(tmp_path / "model.safetensors"), metadata={"format": "np"})
    found = mapped(tmp_path / "model.safetensors")
    _same(found, expected)
    assert all(isinstance(array, np.memmap) for array in found.values() if array.size)  # (the file's, not copies)
    assert not found["weights"].flags.writeable


def _safetensors(path: Path, header: Any, data: bytes = b"", length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "length", "message"),
    [
        ({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, None, "BF16, which NumPy has no"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None, "offsets do not match"),
        ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "offsets do not match"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8, None, "offsets do not match"),
        ({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, None, "data_offsets"),
        ([1, 2], b"", None, "not a JSON object"),
        ({}, b"", 10**9, "more than 100000000"),
        ({}, b"", 10**6, "the file ends inside its 1000000-byte header"),
        ({"w": {"dtype": "F32", "shape": [2**70], "data_offsets": [0, 8]}}, b"\0" * 8, None, "non-negative integer"),
        ({"w": {"dtype": "F32", "shape": [2.9], "data_offsets": [0, 8]}}, b"\0" * 8, None, "non-negative integer"),
        ({"w": {"dtype": "F32", "shape": "12", "data_offsets": [0, 8]}}, b"\0" * 8, None, "not a list"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, b"\0" * 8, None, "not a list of 2"),
        ({"w": [1]}, b"", None, "not described by a JSON object"),
        ({"w": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "NumPy has no dtype"),
    ],
)
def test_a_malformed_safetensors_file_is_refused_saying_why(
    tmp_path: Path, header: Any, data: bytes, length: int | None, message: str
) -> None:
    """A header that lies (offsets, shape, dtype, length) or is not an object: ValueError naming the file and the
    fault, never a view past the file's end."""
    path = _safetensors(tmp_path / "bad.safetensors", header, data, length)
    with pytest.raises(ValueError, match=r"not a readable \.safetensors file") as raised:
        mapped(path)
    assert message in str(raised.value)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "w": {"dtype": "U8", "shape": [1], '
         b'"data_offsets": [0, 1]}}', "names a key twice"),
        (b"[" * 100_000 + b"]" * 100_000, "not a readable"),
        (b'{"w": {"dtype": "F32", "shape": [Infinity], "data_offsets": [0, 4]}}', "non-negative integer"),
    ],
)  # fmt: skip
def test_a_hostile_safetensors_header_is_refused(tmp_path: Path, raw: bytes, message: str) -> None:
    """Repeated names, a header nested past Python's recursion limit, Infinity as a size: each a ValueError."""
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0")
    with pytest.raises(ValueError, match=message):
        mapped(path)


def test_hostile_npy_and_npz_files_are_refused(tmp_path: Path) -> None:
    """A missing, empty or zip-in-disguise .npy, an .npz member whose header claims more than it holds, and one whose
    compressed data is corrupt: each a ValueError naming the file."""
    (tmp_path / "empty.npy").write_bytes(b"")
    disguised = io.BytesIO()
    np.savez(disguised, w=np.arange(3))
    (tmp_path / "disguised.npy").write_bytes(disguised.getvalue())
    huge = tmp_path / "huge.npz"
    np.savez(huge, w=np.arange(4.0))
    data = huge.read_bytes()
    huge.write_bytes(data.replace(b"'shape': (4,)", b"'shape': (9,)", 1))
    corrupt = tmp_path / "corrupt.npz"
    np.savez_compressed(corrupt, w=np.arange(1000.0))
    data = bytearray(corrupt.read_bytes())
    data[80:120] = b"\xff" * 40
    corrupt.write_bytes(bytes(data))
    for name, message in [
        ("missing.npy", "not a readable .npy file"),
        ("empty.npy", "not a readable .npy file"),
        ("disguised.npy", "it is a zip archive"),
        ("huge.npz", "header does not match its size"),
        ("corrupt.npz", "not a readable .npz file"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)) as raised:
            mapped(tmp_path / name)
        assert name in str(raised.value)


def test_arrays_of_objects_are_never_unpickled(tmp_path: Path) -> None:
    """An .npy or .npz holding Python objects (pickles) is refused: nothing is unpickled."""
    objects = np.array([{"a": 1}, None], dtype=object)
    np.save(tmp_path / "objects.npy", objects, allow_pickle=True)
    np.savez(tmp_path / "objects.npz", objects=objects)
    with pytest.raises(ValueError, match="Python objects"):
        mapped(tmp_path / "objects.npy")
    with pytest.raises(ValueError, match="holds Python objects, which are never unpickled"):
        mapped(tmp_path / "objects.npz")


@pytest.mark.parametrize("name", ["model.pkl", "model.joblib", "weights"])
def test_other_files_are_refused_naming_the_formats(tmp_path: Path, name: str) -> None:
    """A file of another kind: ValueError listing what is read (pickles, joblib files included, are not)."""
    (tmp_path / name).write_bytes(b"\x80\x04N.")
    with pytest.raises(ValueError, match=r"reads \.npy, \.npz and \.safetensors files"):
        mapped(tmp_path / name)


def test_a_truncated_npz_is_refused(tmp_path: Path) -> None:
    """An .npz cut short: ValueError naming the file, not a zipfile or struct error."""
    np.savez(tmp_path / "model.npz", **_arrays())
    data = (tmp_path / "model.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.npz: not a readable \.npz file"):
        mapped(tmp_path / "cut.npz")


MULTI_MODEL = """
    import os

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return inference_server.mapped(os.path.join(model_dir, "weights.npy"))

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {"pid": os.getpid(), "sum": float(model.sum())}  # (reads every page)
"""


def _mapping(pid: int, path: str) -> dict[str, int]:
    """The fields of ``/proc/PID/smaps`` (bytes) summed over the mappings of the file ``path``; empty if none."""
    fields: dict[str, int] = {}
    ours = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):  # a mapping's header: range, perms, offset, dev, inode, path
            ours = len(head) >= 6 and head[5] == path
        elif ours and len(head) >= 2 and head[1].isdigit():
            fields[head[0].rstrip(":")] = fields.get(head[0].rstrip(":"), 0) + int(head[1]) * 1024
    return fields


@pytest.mark.parametrize("loader", ["mapped", "np.load"])
def test_workers_of_a_multi_model_endpoint_share_a_mapped_model(
    servers: ServerFactory, plugin_site: Any, tmp_path: Path, loader: str
) -> None:
    """A model loaded through /models in each of two workers: mapped, its 64 MiB are pages both share (the page
    cache: the file's mapping resident, none of it private, each worker's PSS half of it); read with numpy.load,
    each worker holds a private copy and maps nothing of the file."""
    source = (
        MULTI_MODEL
        if loader == "mapped"
        else MULTI_MODEL.replace("inference_server.mapped(", "__import__('numpy').load(")
    )
    plugin_site.add("mapped_model", source)
    models = tmp_path / "models"
    (models / "big").mkdir(parents=True)
    np.save(models / "big" / "weights.npy", np.full(64 * MIB // 8, 0.5))
    server = servers.start("--multi-model", "--workers", "2", "--allow-model-dir", str(models))
    reply = server.request("POST", "/models", json.dumps({"model_name": "big", "url": str(models / "big")}).encode())
    assert reply.status == 200, reply.body
    seen: set[int] = set()

    def both_answered() -> bool:
        answer = server.request("POST", "/models/big/invoke", b"[1]", {"Content-Type": "application/json"})
        assert answer.status == 200, answer.body
        assert answer.json()["sum"] == 0.5 * 64 * MIB / 8
        seen.add(answer.json()["pid"])
        return len(seen) == 2

    wait_until(both_answered, 30, "both workers did not answer", poll=0)
    weights = str((models / "big" / "weights.npy").resolve())
    for pid in seen:
        if loader == "mapped":  # the file's mapping: all of it resident, none of it private, half of it each's
            mapping = _mapping(pid, weights)
            assert mapping["Rss"] >= 64 * MIB, mapping
            assert mapping["Private_Clean"] + mapping["Private_Dirty"] == 0, mapping
            assert mapping["Pss"] <= mapping["Rss"] // 2 + MIB, mapping
        else:
            memory = smaps_rollup(pid)
            assert memory["Private_Dirty"] + memory["Private_Clean"] >= 64 * MIB, memory
            assert _mapping(pid, weights) == {}
