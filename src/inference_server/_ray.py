"""Joining a Ray cluster, or starting a local Ray and ending every process of it: what ``transform --engine ray`` and
``serve --engine ray`` share.

``ray.shutdown()`` stops the head's processes that the driver started, but leaves two of the raylet's children alive
(the dashboard agent and the runtime-env agent, re-parented to init once the raylet is gone). So the processes below
the driver are noted before it, and those still alive a moment after are killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

#: Seconds the processes of a local Ray get to end after ``ray.shutdown()`` before they are killed.
_END_WAIT = 5.0


def prepare(*, log_to_driver: bool) -> None:
    """Set what Ray reads from the environment when it is imported: no usage statistics sent; with the workers'
    lines written here (``log_to_driver``), every line as it was written (Ray folds lines alike, as access lines
    are, and colours the prefixes)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never phone home
    if log_to_driver:
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def start(address: str | None, cpus: int, *, quiet: bool = False, log_to_driver: bool = False) -> tuple[Any, bool]:
    """``ray`` joined to the cluster at ``address`` (``auto``, ``HOST:PORT``, ``ray://...``), else to a local Ray of
    ``cpus`` CPUs on 127.0.0.1 started now; and whether it was started here (then :func:`stop` ends it). Ray's own
    lines below ERROR (the cluster started, its token, ...) are logged only when not ``quiet``."""
    prepare(log_to_driver=log_to_driver)
    import ray

    if ray.is_initialized():
        return ray, False
    level = logging.ERROR if quiet else logging.WARNING
    if address:
        ray.init(address=address, log_to_driver=log_to_driver, logging_level=level)
        return ray, False
    ray.init(
        address="local",  # a new Ray, even when one started by `ray start` runs on this machine (it would be joined)
        num_cpus=cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=log_to_driver,
        logging_level=level,
    )
    return ray, True


def stop(ray: Any) -> None:
    """``ray.shutdown()``, then kill what is left of the local Ray's processes (this process's descendants)."""
    before = _descendants(os.getpid())
    ray.shutdown()
    deadline = time.monotonic() + _END_WAIT
    while before and time.monotonic() < deadline:
        before = {pid: started for pid, started in before.items() if _started(pid) == started}
        if before:
            time.sleep(0.1)
    for pid, started in before.items():
        if _started(pid) == started:  # (the same process, not a new one with its number)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _started(pid: int) -> str | None:
    """When process ``pid`` started (its ``stat``'s start time), or None if there is none (or it is a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def _descendants(root: int) -> dict[int, str]:
    """Every process below ``root`` now, with its start time (Linux's ``/proc``; elsewhere none)."""
    found: dict[int, str] = {}
    waiting = [root]
    while waiting:
        pid = waiting.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError):
                for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
                    started = _started(int(child))
                    if started is not None and int(child) not in found:
                        found[int(child)] = started
                        waiting.append(int(child))
    return found
