"""The durable queue of asynchronous requests: an SQLite database in a directory of its own, shared by every worker
process of the machine (and by the next server started on the same directory).

A request is accepted (its 202 answered) only once its entry is committed to disk (WAL, ``synchronous=FULL``): a
SIGKILL of every process a moment later loses nothing. An entry is ``queued`` until a worker claims it, then
``running`` under its claimer, and deleted when it is finished, in the same transaction that counts its outcome
(``done``, ``failed``, ``expired``: what ``/metrics`` reports).

Who claimed a running entry is an *owner*: a random token and a lock file ``owners/<token>`` that its process holds
an exclusive ``flock`` on for as long as it lives. The kernel lets go of the lock when the process ends, however it
ends (SIGKILL included), so an owner whose lock can be taken is gone, and its running entries go back to the queue
(:meth:`Queue.recover`), to be done again from the start; after :data:`MAX_ATTEMPTS` starts an entry fails instead
(a request that kills its worker each time must not kill every worker in turn). A process id would not do: ids are
reused, and a worker replaced in a running server is a new owner.

So an entry is done exactly once unless its process died while running it; then again, from the start, up to
:data:`MAX_ATTEMPTS` starts in all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

#: How many times an entry is started before the death of its runner is taken as its failure.
MAX_ATTEMPTS = 3
#: The outcomes counted, in the order ``/metrics`` lists them.
OUTCOMES = ("done", "failed", "expired")
#: The count of notifications that could not be delivered.
NOTIFICATION_FAILED = "notification_failed"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request TEXT NOT NULL,
    expires REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'queued',
    owner TEXT,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS entries_by_state ON entries (state, id);
CREATE TABLE IF NOT EXISTS outcomes (outcome TEXT PRIMARY KEY, count INTEGER NOT NULL);
"""


@dataclasses.dataclass(frozen=True)
class Entry:
    """A claimed request: its row, what the route accepted (``request``), and how many times it was started."""

    id: int
    request: dict[str, Any]
    expires: float
    attempts: int

    @property
    def expired(self) -> bool:
        """Whether its ``RequestTTLSeconds`` ran out while it waited."""
        return time.time() > self.expires


class Queue:
    """The queue in ``directory`` (made if missing), for this process. Safe to use from several threads."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        (self.directory / "owners").mkdir(parents=True, exist_ok=True)
        (self.directory / "inputs").mkdir(exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.directory / "queue.sqlite3", timeout=30, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)  # (each statement its own transaction: they may all run again)
        self._owner: tuple[str, int] | None = None

    def close(self) -> None:
        with self._lock:
            self._db.close()
            if self._owner is not None:
                os.close(self._owner[1])
                self._owner = None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (``BEGIN IMMEDIATE``: no deadlock between two writers)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @property
    def owner(self) -> str:
        """This process's owner token, its lock file held from the first call until the process ends."""
        if self._owner is None:
            token = uuid.uuid4().hex
            owners = self.directory / "owners"
            # locked under a hidden name, then renamed: a file under its token is always locked while its owner lives
            fd = os.open(owners / f".{token}", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(owners / f".{token}", owners / token)
            self._owner = (token, fd)
        return self._owner[0]

    def put(self, request: dict[str, Any], ttl: float, limit: int) -> bool:
        """Queue ``request`` (durably) to expire ``ttl`` seconds from now; False, and nothing queued, if ``limit``
        entries are queued or running already."""
        with self._transaction() as db:
            (count,) = db.execute("SELECT count(*) FROM entries").fetchone()
            if count >= limit:
                return False
            db.execute(
                "INSERT INTO entries (request, expires) VALUES (?, ?)",
                (orjson.dumps(request).decode(), time.time() + ttl),
            )
        return True

    def claim(self, running_limit: int) -> Entry | None:
        """The next entry for this process to run, marked running under its owner: an expired one first (finishing
        it costs no model call, whatever is running), else the oldest queued one if fewer than ``running_limit`` run
        on the machine; None if there is nothing to do now."""
        owner = self.owner
        with self._transaction() as db:
            row = db.execute(
                "SELECT id, request, expires, attempts FROM entries WHERE state = 'queued' AND expires < ? "
                "ORDER BY id LIMIT 1",
                (time.time(),),
            ).fetchone()
            if row is None:
                (running,) = db.execute("SELECT count(*) FROM entries WHERE state = 'running'").fetchone()
                if running >= running_limit:
                    return None
                row = db.execute(
                    "SELECT id, request, expires, attempts FROM entries WHERE state = 'queued' ORDER BY id LIMIT 1"
                ).fetchone()
                if row is None:
                    return None
            db.execute(
                "UPDATE entries SET state = 'running', owner = ?, attempts = attempts + 1 WHERE id = ?", (owner, row[0])
            )
        return Entry(row[0], orjson.loads(row[1]), row[2], row[3] + 1)

    def finish(self, entry: Entry, outcome: str) -> None:
        """``entry`` is over (``outcome``: one of :data:`OUTCOMES`): deleted, and counted."""
        with self._transaction() as db:
            db.execute("DELETE FROM entries WHERE id = ?", (entry.id,))
            self._count(db, outcome)

    def count(self, what: str) -> None:
        """Count one more of ``what`` (:data:`NOTIFICATION_FAILED`)."""
        with self._transaction() as db:
            self._count(db, what)

    @staticmethod
    def _count(db: sqlite3.Connection, what: str) -> None:
        db.execute(
            "INSERT INTO outcomes (outcome, count) VALUES (?, 1) ON CONFLICT (outcome) DO UPDATE SET count = count + 1",
            (what,),
        )

    def release(self, entry: Entry) -> None:
        """Put ``entry`` back in the queue, as if never started (its runner could not run it: a drain began)."""
        with self._transaction() as db:
            db.execute(
                "UPDATE entries SET state = 'queued', owner = NULL, attempts = attempts - 1 WHERE id = ?", (entry.id,)
            )

    def recover(self) -> int:
        """Put back in the queue the running entries of owners that are gone (their lock file free), and remove the
        lock files of owners gone; how many entries."""
        with self._lock:
            owners = [row[0] for row in self._db.execute("SELECT DISTINCT owner FROM entries WHERE state = 'running'")]
        gone = [owner for owner in owners if owner is not None and not self._alive(owner)]
        for path in (self.directory / "owners").iterdir():
            if not path.name.startswith(".") and path.name not in owners and not self._alive(path.name):
                path.unlink(missing_ok=True)
        if not gone:
            return 0
        with self._transaction() as db:
            marks = ",".join("?" * len(gone))
            cursor = db.execute(
                f"UPDATE entries SET state = 'queued', owner = NULL WHERE state = 'running' AND owner IN ({marks})",
                gone,
            )
            recovered = cursor.rowcount
        for owner in gone:
            (self.directory / "owners" / owner).unlink(missing_ok=True)
        return recovered

    def _alive(self, owner: str) -> bool:
        """Whether the process of ``owner`` still holds its lock (this one's own is alive)."""
        if self._owner is not None and owner == self._owner[0]:
            return True
        try:
            fd = os.open(self.directory / "owners" / owner, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # (releases the lock taken, if it was)
        return False

    def counts(self) -> dict[str, int]:
        """Entries queued and running now, and the outcomes counted since the queue was made."""
        with self._lock:
            found = dict.fromkeys(("queued", "running", *OUTCOMES, NOTIFICATION_FAILED), 0)
            found.update(self._db.execute("SELECT state, count(*) FROM entries GROUP BY state").fetchall())
            found.update(self._db.execute("SELECT outcome, count FROM outcomes").fetchall())
        return found
