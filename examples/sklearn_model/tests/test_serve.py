"""A real server with the plugin: concurrent requests are answered correctly and share predict_proba calls."""

import json
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import joblib
import numpy as np
from sklearn.datasets import load_iris

#: Requests sent at once; each carries one row of its own.
CONCURRENT = 24


def test_concurrent_requests_are_grouped_and_answered_correctly(serve: Callable[..., Any], model_dir: Path) -> None:
    """Requests sent together each get their own row's probabilities, and the log shows calls on several rows."""
    server = serve("--model-dir", str(model_dir), "--log-level", "debug")
    rows = load_iris().data[::6][:CONCURRENT]  # 24 different flowers of the three species
    start = threading.Barrier(CONCURRENT)

    def send(i: int) -> tuple[int, str, bytes]:
        if i % 2:
            body, content_type = json.dumps([rows[i].tolist()]), "application/json"
        else:
            body, content_type = ",".join(map(str, rows[i])), "text/csv"
        start.wait()
        return server.request("POST", "/invocations", body.encode(), {"Content-Type": content_type})

    with ThreadPoolExecutor(CONCURRENT) as pool:
        answers = list(pool.map(send, range(CONCURRENT), timeout=30))

    expected = joblib.load(model_dir / "model.joblib").predict_proba(rows)
    for i, (status, content_type, body) in enumerate(answers):
        assert status == 200, body
        if content_type == "text/csv":
            np.testing.assert_allclose(np.loadtxt(body.decode().splitlines(), delimiter=","), expected[i])
        else:
            np.testing.assert_allclose(json.loads(body), expected[i : i + 1])
    deadline = time.monotonic() + 5  # the server writes its info and debug lines a few milliseconds later
    calls = [int(count) for count in re.findall(r"predict_proba on (\d+) rows", server.output())]
    while sum(calls) < CONCURRENT and time.monotonic() < deadline:
        time.sleep(0.05)
        calls = [int(count) for count in re.findall(r"predict_proba on (\d+) rows", server.output())]
    assert sum(calls) == CONCURRENT, calls
    assert max(calls) > 1, f"every call had one row: no batching ({calls})"
