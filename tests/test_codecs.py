"""The codec contract, run against every registered codec, and the registry's negotiation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_server import codecs
from inference_server.errors import DecodeError, NotAcceptable, UnsupportedMediaType

ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array(3.5),  # 0-d
    np.empty((0, 3), dtype=np.int16),  # empty
    np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2],  # non-contiguous
    np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
    np.arange(5, dtype=">f8"),  # big-endian
    np.array([True, False, True]),
    np.array([1.5, -2.25], dtype=np.float16),
    np.array([1 + 2j, 3 - 4j], dtype=np.complex128),
    np.array(["ünï", "cødé", ""], dtype="<U4"),
    np.array(["2024-01-01", "1999-12-31"], dtype="datetime64[D]"),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),
    np.random.default_rng(0).random((10, 3, 4)),
]

SAMPLES: dict[str, list[Any]] = {
    "application/x-npy": ARRAYS,
    "application/x-npz": [
        {"scores": ARRAYS[0], "conf": ARRAYS[5], "explains": ARRAYS[3]},
        {"only": ARRAYS[1]},
        {f"a{i}": array for i, array in enumerate(ARRAYS)},
    ],
    "application/vnd.apache.arrow.stream": [
        pa.table({"x": [1, 2, 3], "name": ["a", "ü", None]}),
        pa.table({"f": pa.array([], pa.float32())}),
    ],
    "application/vnd.apache.arrow.file": [pa.table({"x": np.arange(1000.0), "y": np.arange(1000) % 7})],
    "application/json": [{"location": "Fair Isle", "n": [1, 2.5, None, True]}, [], "ünïcødé ✓", 3],
    "application/jsonlines": [[{"a": 1}, {"b": "ü"}, [1, 2]], []],
    "text/csv": [np.array([[1.0, 2.5], [-3.0, 1e-300]]), [["a", "b,c"], ['quote "d"', "ü"]]],
    "text/plain": ["hello", "ünï\ncødé ✓", ""],
    "application/octet-stream": [b"\x00\x01binary", b""],
}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, pa.Table):
        return a.equals(b)
    return bool(a == b)


def _decode_error(data: bytes, media_type: str) -> DecodeError | None:
    """The DecodeError that decoding raises, or None; any other exception fails the test."""
    try:
        codecs.loads(data, media_type)
    except DecodeError as exc:
        return exc
    return None


CASES = [(media_type, i) for media_type, samples in SAMPLES.items() for i in range(len(samples))]


def test_every_registered_codec_has_samples() -> None:
    """The contract below covers each built-in media type."""
    assert set(codecs.media_types()) == set(SAMPLES)


@pytest.mark.parametrize(("media_type", "index"), CASES)
def test_round_trip(media_type: str, index: int) -> None:
    """decode(encode(x)) == x, and the body is the concatenation of encode's buffers."""
    value = SAMPLES[media_type][index]
    assert codecs.lookup(media_type).can_encode(value)  # type: ignore[union-attr]
    parts = codecs.encode(value, media_type)
    body = codecs.dumps(value, media_type)
    assert body == b"".join(parts)
    assert _equal(value, codecs.loads(body, media_type))


@pytest.mark.parametrize("media_type", list(SAMPLES))
def test_media_type_matching_ignores_case_and_parameters(media_type: str) -> None:
    """``Application/X-NPY; charset=binary`` finds the npy codec."""
    mangled = media_type.upper() + "; charset=binary"
    value = SAMPLES[media_type][0]
    assert _equal(value, codecs.loads(codecs.dumps(value, media_type), mangled))


@pytest.mark.parametrize("media_type", list(SAMPLES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=512))
def test_random_bodies_decode_or_raise_decode_error(media_type: str, data: bytes) -> None:
    """Random bytes either decode or raise DecodeError (a ValueError and a 400), never anything else."""
    error = _decode_error(data, media_type)
    if error is not None:
        assert isinstance(error, ValueError)
        assert error.code == 400
        assert error.description


@pytest.mark.parametrize(("media_type", "index"), CASES)
@settings(max_examples=40, deadline=None)
@given(st.data())
def test_mutated_bodies_decode_or_raise_decode_error(media_type: str, index: int, data: st.DataObject) -> None:
    """Valid bodies with bytes flipped, cut or inserted decode or raise DecodeError, never anything else."""
    body = bytearray(codecs.dumps(SAMPLES[media_type][index], media_type))
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        position = data.draw(st.integers(0, max(len(body) - 1, 0)))
        if action == "flip" and body:
            body[position] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del body[position:]
        else:
            body[position:position] = data.draw(st.binary(min_size=1, max_size=8))
    error = _decode_error(bytes(body), media_type)
    assert error is None or error.description


def test_unknown_media_type_is_415_listing_the_supported() -> None:
    """Decoding a type nobody knows is UnsupportedMediaType naming the known ones."""
    with pytest.raises(UnsupportedMediaType, match=r"cannot decode 'image/png'; supported: application/x-npy"):
        codecs.loads(b"", "image/png")


def test_register_a_codec_of_ones_own() -> None:
    """A plugin registers a codec; it decodes and joins negotiation; registering twice needs replace=True."""

    class Upper(codecs.Codec):
        media_type = "text/x-upper"

        def decode(self, data: Any, limits: codecs.Limits) -> str:
            return bytes(data).decode().upper()

        def encode(self, obj: Any) -> list[codecs.Buffer]:
            return [obj.upper().encode()]

        def can_encode(self, obj: Any) -> bool:
            return isinstance(obj, str)

    codec = codecs.register(Upper())
    try:
        assert codecs.loads(b"abc", "Text/X-Upper") == "ABC"
        assert codecs.negotiate("text/x-upper", "shout") is codec
        with pytest.raises(ValueError, match="registered already"):
            codecs.register(Upper())
        codecs.register(Upper(), replace=True)
    finally:
        codecs._registry._codecs.pop("text/x-upper")


@pytest.mark.parametrize(
    ("accept", "obj", "expected"),
    [
        ("*/*", np.zeros(3), "application/x-npy"),
        (None, {"a": np.zeros(3)}, "application/x-npz"),
        ("", pa.table({"x": [1]}), "application/vnd.apache.arrow.stream"),
        ("*/*", {"location": "x"}, "application/json"),
        ("*/*", "text", "text/plain"),
        ("application/json", np.zeros(3), "application/json"),
        ("text/*", np.zeros((2, 2)), "text/csv"),
        ("application/json;q=0.5, application/x-npy;q=0.9", np.zeros(3), "application/x-npy"),
        ("application/x-npy;q=0.1, */*;q=0.5", np.zeros(3), "application/x-npz"),
        ("application/json;q=0, */*", [{"a": 1}], "application/jsonlines"),
        ("APPLICATION/JSON", np.zeros(3), "application/json"),
    ],
)
def test_negotiate(accept: str | None, obj: Any, expected: str) -> None:
    """The highest q wins, the most specific range sets q, ties go to the object's natural format."""
    assert codecs.negotiate(accept, obj).media_type == expected


def test_negotiate_prefers_configured_default_on_ties() -> None:
    """``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT`` breaks ties under ``*/*`` when it can encode the prediction."""
    assert codecs.negotiate("*/*", np.zeros(3), default="application/json").media_type == "application/json"
    assert codecs.negotiate("*/*", b"x", default="application/json").media_type == "application/octet-stream"
    assert codecs.negotiate("application/x-npy", np.zeros(3), default="application/json").media_type == (
        "application/x-npy"
    )


#: Predictions of every kind the codecs tell apart, for :func:`test_one_range_chooses_as_the_full_ranking_does`.
PREDICTIONS = [
    np.zeros(3, dtype="f4"),
    np.array([["a", "b"]]),
    np.array([{"a": 1}], dtype=object),
    {"a": np.zeros(2)},
    {"a": 1},
    [[1.0, 2.0]],
    [{"a": 1}],
    "text",
    b"bytes",
    pa.table({"x": [1]}),
    None,
    object(),
]


@pytest.mark.parametrize(
    "accept",
    ["*/*", "", "application/json", "application/x-npy", "text/csv", "application/x-npz", "text/plain",
     "application/jsonlines", "application/octet-stream", "application/vnd.apache.arrow.stream", "text/*",
     "image/png", "application/json;q=0.3", "Application/JSON", "application/json;q=0"],
)  # fmt: skip
@pytest.mark.parametrize("default", [None, "application/json", "text/csv", "application/x-npy"])
@pytest.mark.parametrize("request_type", [None, "application/json", "text/csv", "application/x-npy", "image/png"])
def test_one_range_chooses_as_the_full_ranking_does(accept: str, default: str | None, request_type: str | None) -> None:
    """An Accept of one range picks, without ranking every codec, the codec the full ranking picks (or the same
    error), for every kind of prediction, default and request type."""
    from inference_server.codecs import _registry

    for obj in PREDICTIONS:
        ranges = _registry._ranges(accept)
        try:
            expected: Any = _registry._ranked(ranges, accept, obj, default, request_type)
        except Exception as exc:
            expected = (type(exc), str(exc))
        try:
            chosen: Any = codecs.negotiate(accept, obj, default, request_type)
        except Exception as exc:
            chosen = (type(exc), str(exc))
        assert chosen == expected, (accept, obj, default, request_type)


def test_negotiate_accepts_werkzeug_mime_accept() -> None:
    """The ``accept`` argument of ``output_fn`` (werkzeug's MIMEAccept) negotiates like the header."""
    import werkzeug.http

    from inference_server import MIMEAccept

    accept = werkzeug.http.parse_accept_header("application/json;q=0.2, application/x-npz", MIMEAccept)
    assert codecs.negotiate(accept, np.zeros(2)).media_type == "application/x-npz"


def test_nothing_acceptable_is_406_listing_what_could_be_sent() -> None:
    """No acceptable codec: NotAcceptable naming the prediction's possible types."""
    with pytest.raises(
        NotAcceptable, match=r"cannot send a ndarray as 'image/png'; it can be sent as: application/x-npy"
    ):
        codecs.negotiate("image/png", np.zeros(3))


def test_limits_scale_with_max_payload() -> None:
    """Decompression is bounded by 10x MaxPayloadInMB (1 GiB when bodies have no limit), the bound named."""
    assert codecs.Limits.for_payload(6).max_decompressed_bytes == 60 << 20
    assert codecs.Limits.for_payload(200).max_decompressed_bytes == 2000 << 20
    assert codecs.Limits.for_payload(0).max_decompressed_bytes == 1 << 30
    assert codecs.Limits.for_payload(6).decompressed_bound.startswith("10 x the body limit of 6 MB (MaxPayloadInMB)")
