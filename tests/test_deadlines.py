"""Deadlines: the watchdog that cancels calls run inline, and the helper threads that let ``/ping`` and streams be
answered when their work overruns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from inference_server import _deadlines
from tests.conftest import wait_until


def _within(seconds: float) -> Callable[[], float]:
    """A fixed deadline ``seconds`` from now, as Pool.run asks for it."""
    end = time.monotonic() + seconds
    return lambda: end


def test_run_returns_the_result_and_reuses_the_thread() -> None:
    """Work runs on a helper thread; the same helper serves the next call."""
    pool = _deadlines.Pool("test")
    names = [pool.run(lambda: threading.current_thread().name, _within(5)) for _ in range(3)]
    assert names[0] != threading.current_thread().name
    assert len(set(names)) == 1
    assert pool.size == 1


def test_run_reraises_the_work_exception() -> None:
    """An exception in the work is raised in the waiting thread."""
    pool = _deadlines.Pool("test")

    def fail() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        pool.run(fail, _within(5))
    assert pool.run(lambda: 7, _within(5)) == 7


def test_overrun_raises_timed_out_and_the_helper_comes_back() -> None:
    """Past the deadline the waiter gets TimedOut; the abandoned helper rejoins the pool when its work ends."""
    pool = _deadlines.Pool("test")
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(_deadlines.TimedOut) as caught:
        pool.run(release.wait, lambda: started + 0.2)
    assert 0.2 <= time.monotonic() - started < 5  # (the work itself never ends before it is released)
    assert caught.value.helper.abandoned
    assert not pool.idle
    release.set()
    wait_until(lambda: pool.idle, 5, "the helper did not come back")
    assert pool.idle == [caught.value.helper]
    assert not caught.value.helper.abandoned
    assert pool.run(lambda: "again", _within(5)) == "again"
    assert pool.size == 1


def test_a_moving_deadline_is_followed() -> None:
    """The deadline is asked again when a wait ends: work that moved on to a later deadline is waited for."""
    pool = _deadlines.Pool("test")
    call = _deadlines.Call()
    start = time.monotonic()

    def work() -> str:
        call.enter(_deadlines.RUNNING)
        time.sleep(0.3)
        return "done"

    assert pool.run(work, lambda: start + (0.1 if call.stage == _deadlines.READING else 5)) == "done"


def test_overrunning_counts_abandoned_helpers_until_they_return() -> None:
    """``overrunning`` counts helpers whose deadline passed while their work goes on; concurrent work is not refused."""
    pool = _deadlines.Pool("ping")
    release = threading.Event()
    with pytest.raises(_deadlines.TimedOut):
        pool.run(release.wait, _within(0.05))
    assert pool.overrunning == 1
    assert pool.run(lambda: True, _within(1)) is True  # another helper serves meanwhile
    release.set()
    wait_until(lambda: not pool.overrunning, 5, "the helper still counts as overrunning")


def test_cancelled_call_gives_back_its_slot_once() -> None:
    """Cancelling a call returns its model slot; the work's own give_back is then a no-op; later stages stop."""
    slots = threading.BoundedSemaphore(1)
    call = _deadlines.Call()
    call.take_slot(slots)
    assert call.stage == _deadlines.RUNNING
    assert not slots.acquire(blocking=False)
    assert call.cancel() == _deadlines.RUNNING
    call.give_back()  # BoundedSemaphore raises if released twice
    assert slots.acquire(blocking=False)
    with pytest.raises(_deadlines.Cancelled):
        call.enter(_deadlines.RUNNING)
    slots.release()


def test_a_slot_handed_over_stays_with_the_work_past_the_cancel() -> None:
    """A slot handed over to work on another thread is not given back by the call's cancel (the work still runs and
    gives it back when it ends); a call cancelled before the hand-over keeps nothing to hand over (Cancelled)."""
    slots = threading.BoundedSemaphore(1)
    call = _deadlines.Call()
    call.take_slot(slots)
    slot = call.hand_over()
    assert call.cancel() == _deadlines.RUNNING
    call.give_back()
    assert not slots.acquire(blocking=False)  # the work holds it still
    slot.release()
    late = _deadlines.Call()
    late.take_slot(slots)
    late.cancel()
    with pytest.raises(_deadlines.Cancelled):
        late.hand_over()
    assert slots.acquire(blocking=False)  # given back by the cancel, once
    slots.release()


def test_a_pace_runs_inline_after_a_streak_of_quick_calls_until_one_is_slow() -> None:
    """A model's calls go inline after QUICK_STREAK quick ones in a row on the threads (a slow one restarts the
    count), and back to the threads after one inline call slower than the pace's own threshold."""
    pace = _deadlines.Pace(slow=0.02)
    for _ in range(_deadlines.QUICK_STREAK - 1):
        pace.timed(lambda: None)
    pace.timed(lambda: time.sleep(0.002))
    assert not pace.inline
    for _ in range(_deadlines.QUICK_STREAK):
        pace.timed(lambda: None)
    assert pace.inline
    assert pace.inline_call(lambda: time.sleep(0.01) or 7) == 7  # under its threshold: inline still
    assert pace.inline
    pace.inline_call(lambda: time.sleep(0.03))
    assert not pace.inline
    assert pace.streak == 0


def test_cancelled_call_waiting_for_a_slot_does_not_keep_it() -> None:
    """A call cancelled while it waited for the model releases the slot it gets and stops."""
    slots = threading.BoundedSemaphore(1)
    slots.acquire()
    call = _deadlines.Call()
    errors: list[BaseException] = []

    def wait_for_slot() -> None:
        try:
            call.take_slot(slots)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait_for_slot)
    waiter.start()
    wait_until(lambda: call.stage == _deadlines.WAITING, 5, "the call did not begin waiting for a slot")
    assert call.cancel() == _deadlines.WAITING
    slots.release()
    waiter.join(5)
    assert isinstance(errors[0], _deadlines.Cancelled)
    assert slots.acquire(blocking=False)


def _until(condition: Callable[[], bool], seconds: float = 5) -> None:
    wait_until(condition, seconds, "the watchdog did not get there")


class _Rounds:
    """Watched beside the calls: counts the watchdog's rounds and notes the time of the last, so that a test waits
    for the watchdog to have looked again rather than for a time."""

    def __init__(self, watchdog: _deadlines.Watchdog) -> None:
        self.count, self.last = 0, 0.0
        self.watchdog = watchdog
        watchdog.watch(self)  # type: ignore[arg-type]

    def check(self, now: float, grace: float) -> None:
        self.count, self.last = self.count + 1, now

    def wait(self, rounds: int = 3, *, past: float = 0.0) -> None:
        """Wait for ``rounds`` more rounds of the watchdog, the last at or after the moment ``past``."""
        target = self.count + rounds
        _until(lambda: self.count >= target and self.last >= past)


def test_the_watchdog_cancels_an_overrunning_call_and_reports_it_stuck_after_the_grace() -> None:
    """Past its deadline a running call is cancelled (its model slot given back at once, so others go on); still
    watched ``grace`` later, it is reported stuck, once."""
    watchdog = _deadlines.Watchdog(grace=0.2, period=0.01)
    slots = threading.BoundedSemaphore(1)
    stuck: list[float] = []
    call = _deadlines.Call(deadline=time.monotonic() + 0.1, stuck=lambda _: stuck.append(time.monotonic()))
    call.enter(_deadlines.WAITING)
    call.take_slot(slots)
    started = time.monotonic()
    watchdog.watch(call)
    _until(lambda: call.cancelled)
    assert call.overran == _deadlines.RUNNING
    assert slots.acquire(blocking=False)  # given back while the work still runs
    _until(lambda: bool(stuck))
    assert stuck[0] - started >= 0.25
    _Rounds(watchdog).wait(5)
    assert len(stuck) == 1
    watchdog.unwatch(call)
    with pytest.raises(_deadlines.Cancelled):
        call.enter(_deadlines.RUNNING)  # the work stops at its next stage
    slots.release()


def test_work_that_ends_within_the_grace_is_not_reported_stuck() -> None:
    """A call unwatched (its work ended) after its deadline but before the grace is over is not reported."""
    watchdog = _deadlines.Watchdog(grace=0.3, period=0.01)
    stuck: list[bool] = []
    deadline = time.monotonic() + 0.05
    call = _deadlines.Call(deadline=deadline, stuck=lambda _: stuck.append(True))
    call.stage = _deadlines.RUNNING
    watchdog.watch(call)
    rounds = _Rounds(watchdog)
    _until(lambda: call.cancelled)
    watchdog.unwatch(call)
    rounds.wait(past=deadline + 0.3 + 0.05)  # the watchdog has looked after the grace was over
    assert stuck == []


def test_a_body_read_past_its_read_deadline_is_aborted() -> None:
    """A call still reading its body past the read deadline is cancelled and its read aborted; a call that got past
    reading is held to the later deadline only."""
    watchdog = _deadlines.Watchdog(grace=1, period=0.01)
    aborted: list[str] = []
    reading = _deadlines.Call(time.monotonic() + 0.05, time.monotonic() + 60, abort=lambda _: aborted.append("r"))
    waiting = _deadlines.Call(time.monotonic() + 0.05, time.monotonic() + 60, abort=lambda _: aborted.append("w"))
    waiting.enter(_deadlines.WAITING)
    watchdog.watch(reading)
    watchdog.watch(waiting)
    rounds = _Rounds(watchdog)
    _until(lambda: reading.cancelled)
    rounds.wait(3)
    assert (aborted, reading.overran, waiting.cancelled) == (["r"], _deadlines.READING, False)
    watchdog.unwatch(reading)
    watchdog.unwatch(waiting)


def test_waiting_for_a_slot_ends_at_the_deadline() -> None:
    """A call waiting for a busy model slot stops at its deadline (Cancelled), holding no slot."""
    slots = threading.BoundedSemaphore(1)
    slots.acquire()
    call = _deadlines.Call(deadline=time.monotonic() + 0.1)
    started = time.monotonic()
    with pytest.raises(_deadlines.Cancelled):
        call.take_slot(slots)
    assert 0.09 <= time.monotonic() - started < 1
    assert (call.cancelled, call.overran) == (True, _deadlines.WAITING)
    slots.release()
    assert slots.acquire(blocking=False)
