"""Reply bodies: cleanups run once when the server closes the body, and items are buffers every server sends."""

from __future__ import annotations

import numpy as np
import pytest

from inference_server.wsgi._replies import HAND_OVER, PIECE, Body


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
