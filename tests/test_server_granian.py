"""The granian backend's reliance on granian's internals is checked, not assumed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inference_server._settings import Settings
from inference_server.server import granian


@pytest.fixture
def server() -> Iterator[granian.Server]:
    """Our granian supervisor, constructed but not serving."""
    server = granian.Server(Settings(host="127.0.0.1", port=0, workers=1), "wsgi")
    try:
        yield server
    finally:
        server.drain.supervisor.close()


def test_every_granian_internal_we_touch_exists(server: granian.Server) -> None:
    """Each method and attribute the drain and worker replacement rely on is there in the installed granian."""
    granian.check_internals(server)
    for owner, name in granian.INTERNALS:
        assert hasattr(server if owner is granian.MPServer else owner, name), f"{owner}.{name}"


def test_a_missing_internal_stops_start_up_with_its_name(
    server: granian.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were granian to drop one, start-up fails naming it, the versions tested and the way out."""
    monkeypatch.setattr(granian, "INTERNALS", (*granian.INTERNALS, (granian.MPServer, "_gone_in_granian_3")))
    with pytest.raises(RuntimeError, match=r"lacks MPServer\._gone_in_granian_3.*tested with granian 2\.8"):
        granian.check_internals(server)
