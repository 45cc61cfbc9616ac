"""``GET /metrics``: every worker's metrics in the Prometheus text format (see :mod:`inference_server.metrics`).

Served on the server's own threads, never the model's: a scrape is answered while the model is busy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inference_server import metrics
from inference_server.wsgi._replies import Reply, Request

if TYPE_CHECKING:
    from inference_server.wsgi._service import Service


def register(app: Service) -> None:
    """Add ``GET /metrics`` to ``app`` unless its metrics are off (``--no-metrics``)."""
    if app.recorder is not None:
        app.route(metrics.ROUTE, scrape)


def scrape(request: Request) -> Reply:
    body = metrics.scrape()
    return 200, [("Content-Type", metrics.CONTENT_TYPE), ("Content-Length", str(len(body)))], [body]
