"""Reply bodies: cleanups run once when the server closes the body, and items are buffers every server sends;
problems: what went wrong, before a protocol writes it; answers compressed as the client's Accept-Encoding allows."""

from __future__ import annotations

import gzip
import zlib

import numpy as np
import orjson
import pytest
import werkzeug.exceptions

from inference_server.errors import HookError, ServiceUnavailable
from inference_server.wsgi._replies import HAND_OVER, PIECE, Body, compressed, problem_for


def test_cleanups_run_once_when_the_server_closes_the_body() -> None:
    """Iterating a body runs nothing; the server's close() runs its cleanups in order, and a second close() none."""
    calls: list[str] = []
    body = Body([b"a", b"b"], lambda: calls.append("first"), lambda: calls.append("second"))
    assert list(body) == [b"a", b"b"]
    assert calls == []
    body.close()
    body.close()
    assert calls == ["first", "second"]


def test_close_closes_the_items_and_runs_the_cleanups() -> None:
    """A client that went away: close() before the end closes the items (a producing generator) and runs the
    cleanups."""
    calls: list[str] = []

    def produce() -> object:
        try:
            yield b"a"
            yield b"b"
        finally:
            calls.append("generator closed")

    body = Body(produce(), lambda: calls.append("cleanup"))  # type: ignore[arg-type]
    assert next(iter(body)) == b"a"
    body.close()
    assert calls == ["generator closed", "cleanup"]


def test_a_failing_inner_close_still_runs_the_cleanups() -> None:
    """The drain's count is left even when the items' close() raises."""
    calls: list[str] = []

    class Broken(list[bytes]):
        def close(self) -> None:
            raise RuntimeError("close failed")

    body = Body(Broken([b"a"]), lambda: calls.append("cleanup"))
    with pytest.raises(RuntimeError, match="close failed"):
        body.close()
    assert calls == ["cleanup"]


def test_a_small_whole_answer_is_bytes_joined_for_granian_and_item_by_item_for_pep_3333() -> None:
    """Prepared for granian, a whole answer under PIECE bytes is one ``bytes`` item (an array's memory, strided or
    not, copied once: granian reads other buffers element by element); for PEP 3333's servers each item is
    ``bytes``."""
    array = np.arange(6.0).reshape(2, 3)
    items = list(Body([b"head", memoryview(array), memoryview(array[:, ::2])]).prepare(as_bytes=False))
    assert items == [b"head" + array.tobytes() + array[:, ::2].tobytes()]
    assert [type(item) for item in Body([b"head", memoryview(array)]).prepare(as_bytes=True)] == [bytes, bytes]
    alone = b"one"
    assert next(iter(Body([alone]).prepare(as_bytes=False))) is alone  # nothing copied


@pytest.mark.parametrize("as_bytes", [True, False])
def test_a_large_answer_goes_in_pieces_copied_as_they_are_sent(as_bytes: bool) -> None:
    """An answer over PIECE bytes is sent as ``bytes`` pieces of at most PIECE bytes, each made when the server
    asks for the next (so a slow reader holds a few pieces, not a copy of the whole), the same bytes in order."""
    big = np.arange(3 * PIECE // 8 + 5, dtype=np.float64)  # 3 pieces and 40 bytes
    strided = np.arange(40, dtype=np.int32)[::2]
    body = Body([b"head", memoryview(big), strided.data]).prepare(as_bytes)
    pieces = iter(body)
    first = next(pieces)
    assert (type(first), first) == (bytes, b"head")
    rest = list(pieces)
    assert all(type(piece) is bytes and len(piece) <= PIECE for piece in rest)
    assert [len(piece) for piece in rest] == [PIECE, PIECE, PIECE, 40, 80]
    assert b"".join(rest) == big.tobytes() + strided.tobytes()


def test_a_streamed_answer_is_counted_and_sent_as_bytes() -> None:
    """Items made as the answer is sent become ``bytes`` as they come, and ``sent`` counts them."""

    def produce() -> object:
        yield b"a"
        yield memoryview(np.arange(2, dtype=np.uint16))

    body = Body(produce()).prepare(as_bytes=False)  # type: ignore[arg-type]
    assert body.sent == 0
    assert list(body) == [b"a", np.arange(2, dtype=np.uint16).tobytes()]
    assert body.sent == 5


def test_a_small_whole_answer_is_handed_over_as_a_list_with_its_cleanups_run() -> None:
    """For a server that sends a list whole and never closes it (granian), a small whole answer is a plain list of
    flat buffers (no copy of an array's memory) and its cleanups run at once; a large one stays a Body, closed
    by the server after its pieces."""
    calls: list[str] = []
    array = np.arange(6.0)
    handed = Body([b"head", memoryview(array)], lambda: calls.append("left")).prepare(False, hand_over=True)
    assert type(handed) is list
    assert calls == ["left"]
    assert handed[0] == b"head"
    assert isinstance(handed[1], memoryview)
    assert handed[1].obj is array
    assert b"".join(handed) == b"head" + array.tobytes()
    large = Body([memoryview(np.zeros(HAND_OVER))], lambda: calls.append("large")).prepare(False, hand_over=True)
    assert isinstance(large, Body)
    assert calls == ["left"]
    large.close()
    assert calls == ["left", "large"]


ENVIRON = {"REQUEST_METHOD": "POST", "PATH_INFO": "/invocations"}


def test_a_problem_keeps_an_http_errors_status_message_and_headers() -> None:
    """An HTTP error becomes a problem with its status, message and own headers (405's Allow, 503's Retry-After),
    never a Content-Type of its own; SageMaker's routes write it as JSON with those headers."""
    allowed = problem_for(werkzeug.exceptions.MethodNotAllowed(["GET"], "POST is not allowed here"), "r1", ENVIRON)
    assert allowed[:3] == (405, "POST is not allowed here", "r1")
    assert allowed.headers == [("Allow", "GET")]
    busy = problem_for(ServiceUnavailable("draining", headers=[("Retry-After", "1")]), "r2", ENVIRON)
    status, headers, body = busy.reply()
    assert (status, headers[2:]) == (503, [("Retry-After", "1")])
    assert orjson.loads(b"".join(body)) == {"message": "draining", "request_id": "r2", "status": 503}


def test_a_hooks_failure_is_a_500_problem_that_hides_its_message_unless_debug() -> None:
    """A hook's exception is a 500 naming the hook and the exception's class and pointing to the log; its message and
    traceback are in the problem only with debug."""
    error = HookError("predict_fn", ValueError("secret row 7"), "predict_fn raised ValueError")
    quiet = problem_for(error, "r3", ENVIRON)
    assert quiet.status == 500
    assert quiet.message == "predict_fn raised ValueError; see the server log for request r3"
    assert quiet.traceback is None
    loud = problem_for(error, "r3", ENVIRON, debug=True)
    assert loud.message.endswith(": ValueError: secret row 7")
    assert loud.traceback is not None
    assert "ValueError: secret row 7" in loud.traceback
    assert orjson.loads(b"".join(loud.reply()[2]))["traceback"] == loud.traceback


def test_a_werkzeug_error_without_a_description_keeps_a_null_message() -> None:
    """A werkzeug HTTP exception made without a description answers ``"message": null``, as before problems."""

    class Teapot(werkzeug.exceptions.HTTPException):
        code = 418

    status, _, body = problem_for(Teapot(), "r4", ENVIRON).reply()
    assert (status, orjson.loads(b"".join(body))) == (418, {"message": None, "request_id": "r4", "status": 418})


@pytest.mark.parametrize(
    ("accepted", "coding"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip;q=0, deflate", "deflate"),
        ("br, *;q=0.1", "gzip"),
        ("identity", None),
        ("gzip;q=0, deflate;q=0.0", None),
        ("gzip;q=oops", None),
    ],
)
def test_an_answer_is_compressed_as_accept_encoding_allows(accepted: str, coding: str | None) -> None:
    """gzip when allowed (q above 0, or '*'), else deflate, else as it is; the headers say the coding, the new
    length and Vary; the client's decoder gives back the answer."""
    text = b'{"predictions": [' + b"0.25, " * 400 + b"1.0]}"
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(text)))]
    body = compressed({"HTTP_ACCEPT_ENCODING": accepted}, headers, [text[:100], memoryview(text)[100:]])
    if coding is None:
        assert headers == [("Content-Type", "application/json"), ("Content-Length", str(len(text)))]
        assert b"".join(body) == text
        return
    (packed,) = body
    assert dict(headers) == {
        "Content-Type": "application/json",
        "Content-Length": str(len(packed)),
        "Content-Encoding": coding,
        "Vary": "Accept-Encoding",
    }
    assert len(packed) < len(text) // 10
    assert (gzip.decompress(packed) if coding == "gzip" else zlib.decompress(packed)) == text


@pytest.mark.parametrize(
    ("media_type", "size", "whole", "already"),
    [
        ("application/x-npy", 4096, True, False),  # binary arrays: left alone
        ("application/json", 1000, True, False),  # small
        ("application/json", 4096, False, False),  # a stream
        ("application/json", 4096, True, True),  # compressed by the model already
    ],
)
def test_answers_that_gain_little_are_sent_as_they_are(media_type: str, size: int, whole: bool, already: bool) -> None:
    """A binary array, an answer under COMPRESS_FROM bytes, a stream and an answer that has a Content-Encoding of
    its own are not compressed, whatever the client allows."""
    headers = [("Content-Type", media_type), *([("Content-Encoding", "br")] if already else [])]
    given = [b"a" * size] if whole else iter([b"a" * size])
    assert compressed({"HTTP_ACCEPT_ENCODING": "gzip"}, headers, given) is given
    assert headers == [("Content-Type", media_type), *([("Content-Encoding", "br")] if already else [])]
