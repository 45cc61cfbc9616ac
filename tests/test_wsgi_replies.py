"""Reply bodies: cleanups run once when the server closes the body, and items are buffers every server sends."""

from __future__ import annotations

import numpy as np
import pytest

from inference_server.wsgi._replies import Body


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


def test_items_are_flat_unsigned_bytes_or_bytes() -> None:
    """Prepared for granian, an array's memory is a flat view of unsigned bytes (no copy) and a strided one is
    copied; prepared for PEP 3333's servers, every item is ``bytes``."""
    array = np.arange(6.0).reshape(2, 3)
    items = list(Body([b"head", memoryview(array), memoryview(array[:, ::2])]).prepare(as_bytes=False))
    assert items[0] == b"head"
    assert isinstance(items[1], memoryview)
    assert (items[1].format, items[1].ndim, items[1].obj is not None) == ("B", 1, True)
    assert bytes(items[1]) == array.tobytes()
    assert items[2] == array[:, ::2].tobytes()
    assert [type(item) for item in Body([b"head", memoryview(array)]).prepare(as_bytes=True)] == [bytes, bytes]
