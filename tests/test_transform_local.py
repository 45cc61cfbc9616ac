"""``inference-server transform`` with the local engine: real files, the command in a subprocess, a test plugin
that logs every call (its body size) so that the tests see the requests the job made."""

from __future__ import annotations

import contextlib
import io
import os
import pty
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference_server._settings import BatchStrategy
from inference_server.transform import Predictor, TransformOptions, records, storage
from inference_server.transform.job import Job as LocalJob

COUNTING = """
    import os
    import random
    import time

    import inference_server

    @inference_server.plugin_hook
    def input_fn(input_data, content_type):
        return bytes(input_data)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        with open(os.environ["CALLS_LOG"], "a") as log:
            log.write(f"{len(data)}\\n")
        delay = float(os.environ.get("CALL_DELAY", "0"))
        if delay:
            time.sleep(random.uniform(0, delay))
        flaky = os.environ["CALLS_LOG"] + ".flaky"
        if data.startswith(b"flaky") and not os.path.exists(flaky):
            open(flaky, "w").close()
            raise RuntimeError("failing once")
        if data.startswith(b"fail"):
            raise ValueError("asked to fail")
        if os.environ.get("FIRST_LINE_ONLY"):
            return data.split(b"\\n")[0]
        return data.upper()

    @inference_server.plugin_hook
    def output_fn(prediction, accept):
        return prediction, "application/octet-stream"
"""


class Job:
    """Runs the command with the counting plugin; ``calls()`` are the body sizes its model saw."""

    def __init__(self, tmp_path: Path, servers: Any) -> None:
        self.tmp_path = tmp_path
        self.input = tmp_path / "in"
        self.output = tmp_path / "out"
        self.input.mkdir()
        self.log = tmp_path / "calls.log"
        self.env = servers.environment(None, {"CALLS_LOG": str(self.log)})

    def write(self, name: str, data: bytes) -> Path:
        path = self.input / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def command(self, *options: str) -> list[str]:
        return [sys.executable, "-m", "inference_server", "transform", str(self.input), str(self.output), *options]

    def run(self, *options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*options), env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=120
        )

    def calls(self) -> list[int]:
        return [int(line) for line in self.log.read_text().split()] if self.log.exists() else []

    def out(self, name: str) -> bytes:
        return (self.output / f"{name}.out").read_bytes()


@pytest.fixture
def job(tmp_path: Path, servers: Any, plugin_site: Any) -> Job:
    """A job directory with the counting plugin installed."""
    plugin_site.add("counting", COUNTING)
    return Job(tmp_path, servers)


def test_multirecord_lines_fill_requests_up_to_the_limit(job: Job) -> None:
    """Line + MultiRecord: requests of at most MaxPayloadInMB, as few as the limit allows, answers in order."""
    lines = [b"%07d," % i + b"x" * 91 + b"\n" for i in range(25_000)]  # 100 bytes each, 2.5 MB
    job.write("data.csv", b"".join(lines))
    result = job.run("--split-type", "Line", "--batch-strategy", "MultiRecord", "--max-payload-in-mb", "1")
    assert result.returncode == 0, result.stderr
    per_request = (1 << 20) // 100
    assert job.calls() == [per_request * 100] * (25_000 // per_request) + [25_000 % per_request * 100]
    assert job.out("data.csv") == b"".join(lines).upper()
    assert "1 of 1 files transformed" in result.stderr
    assert "25000 records in 3 requests" in result.stderr


def test_multirecord_lines_cut_fast_are_the_records_packed_one_by_one(job: Job) -> None:
    """A file of CRLF and LF lines, blank lines, multi-byte characters and no final newline, over several 1 MB
    requests: the job's requests and output are those of the records packed one by one (split + requests)."""

    def line(number: int) -> bytes:  # CRLF and LF lines; one request's worth has blank lines (packed one by one)
        ending = b"\r\n\r\n\n" if 15_000 <= number < 15_003 else b"\r\n" if number % 2 else b"\n"
        return f"{number},é,{'v' * (number % 173)}".encode() + ending

    lines = [line(number) for number in range(40_000)]
    data = b"".join(lines) + b"last,without newline"
    job.write("data.csv", data)
    options = ("--split-type", "Line", "--batch-strategy", "MultiRecord", "--max-payload-in-mb", "1")
    result = job.run(*options, "--assemble-with", "Line")
    assert result.returncode == 0, result.stderr
    split = records.split(io.BytesIO(data), "Line", "data.csv")
    bodies = [request.body for request in records.requests(split, BatchStrategy.MULTI_RECORD, 1 << 20, "data.csv")]
    assert len(bodies) > 3
    assert job.calls() == [len(body) for body in bodies]
    assert job.out("data.csv") == b"".join(body.upper() + b"\n" for body in bodies)
    assert f"40001 records in {len(bodies)} requests" in result.stderr


class _Unused(Predictor):
    """A predictor for a job that only cuts requests."""

    def __init__(self) -> None:
        self.execution_parameters: dict[str, Any] = {}

    def ready(self) -> None:
        raise AssertionError("not called")

    def predict(self, body: bytes, content_type: str, accept: str = "*/*") -> tuple[bytes, str]:
        raise AssertionError("not called")


@pytest.mark.parametrize(
    ("options", "fast"),
    [
        ({}, True),
        ({"assemble_with": "Line", "max_payload_in_mb": 0}, True),
        ({"content_type": "text/csv", "accept": "application/json"}, True),
        ({"batch_strategy": "SingleRecord"}, False),
        ({"content_type": "text/csv", "input_filter": "$[1:]"}, False),
        ({"content_type": "text/csv", "join_source": "Input"}, False),
        ({"content_type": "application/jsonlines", "output_filter": "$.score"}, False),
        ({"split_type": "RecordIO"}, False),
        ({"split_type": "TFRecord"}, False),
        ({"split_type": "None"}, False),
    ],
)
def test_requests_are_cut_fast_only_when_no_record_is_needed_alone(
    options: dict[str, Any], fast: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The byte-search cutting (records.line_requests) serves MultiRecord Line jobs without an input filter, join
    or output filter, whatever the payload limit, assembly or media types; every other job packs records one by one."""
    cut: list[tuple[Any, ...]] = []

    def line_requests(*args: Any) -> Iterator[records.Request]:
        cut.append(args)
        return iter(())

    monkeypatch.setattr(records, "line_requests", line_requests)
    settings = {"split_type": "Line", "batch_strategy": "MultiRecord", "max_payload_in_mb": 1, **options}
    transform_options = TransformOptions(**settings).resolved(
        {"BatchStrategy": "MultiRecord", "MaxPayloadInMB": 6, "MaxConcurrentTransforms": 1}
    )
    local = LocalJob(transform_options, _Unused(), storage.store(str(tmp_path)), storage.store(str(tmp_path)))
    list(local.requests_of(io.BytesIO(b""), "in", 0, None))
    assert len(cut) == fast


def test_singlerecord_sends_each_line_alone_and_line_assembly_ends_each_answer(job: Job) -> None:
    """SingleRecord: one request per line, without its newline; AssembleWith Line puts a newline after each."""
    job.write("a.csv", b"1,2\n3,4\n5,6\n")
    result = job.run("--split-type", "Line", "--batch-strategy", "SingleRecord", "--assemble-with", "Line")
    assert result.returncode == 0, result.stderr
    assert job.calls() == [3, 3, 3]
    assert job.out("a.csv") == b"1,2\n3,4\n5,6\n"


def test_assemble_with_none_concatenates_the_answers(job: Job) -> None:
    """AssembleWith None: the answers back to back, byte for byte."""
    job.write("a.txt", b"ab\ncd\n")
    assert job.run("--split-type", "Line", "--batch-strategy", "SingleRecord").returncode == 0
    assert job.out("a.txt") == b"ABCD"


def test_split_none_sends_whole_files_and_mirrors_the_tree(job: Job) -> None:
    """SplitType None: each file in one request; OUTPUT mirrors INPUT's directories, in sorted order."""
    job.write("b.bin", b"second\n")
    job.write("sub/deeper/a.bin", b"first\nfile\n")
    result = job.run()
    assert result.returncode == 0, result.stderr
    assert sorted(job.calls()) == [7, 11]
    assert job.out("b.bin") == b"SECOND\n"
    assert job.out("sub/deeper/a.bin") == b"FIRST\nFILE\n"


def test_a_failing_file_is_reported_and_the_others_complete(job: Job) -> None:
    """A record over the limit fails its file (named once, with the record's index, offset, size and the limit) and
    a model error fails its own; the other files are written; exit status 1 with a summary and, since no
    --content-type was given, a hint that the requests were untyped."""
    job.write("big.csv", b"small\n" + b"y" * (1 << 20) + b"\n")
    job.write("bad.csv", b"fail me\n")
    job.write("good.csv", b"fine\n")
    result = job.run("--split-type", "Line", "--max-payload-in-mb", "1")
    assert result.returncode == 1
    assert "failed: big.csv: record 1 (at byte 6) is 1048577 bytes, over the limit of 1048576" in result.stderr
    assert "failed: bad.csv: the request of records 0 to 0 failed: predict_fn raised ValueError" in result.stderr
    assert "hint: the requests were sent as application/octet-stream, since no --content-type was given" in (
        result.stderr
    )
    assert "1 of 3 files transformed (0 skipped, 2 failed)" in result.stderr
    typed = job.run("--split-type", "Line", "--max-payload-in-mb", "1", "--content-type", "text/csv")
    assert typed.returncode == 1
    assert "hint:" not in typed.stderr
    assert job.out("good.csv") == b"FINE\n"
    assert sorted(p.name for p in job.output.iterdir()) == ["good.csv.out"]


def test_fail_fast_stops_at_the_first_failure(job: Job) -> None:
    """--fail-fast: after the first failure no further file is started."""
    job.write("a.csv", b"fail\n")
    for i in range(20):
        job.write(f"b{i:02d}.csv", b"fine\n" * 50)
    result = job.run("--split-type", "Line", "--batch-strategy", "SingleRecord", "--fail-fast")
    assert result.returncode == 1
    assert "failed: a.csv" in result.stderr
    assert len(job.calls()) < 21 * 50


def test_concurrency_keeps_each_files_order(job: Job) -> None:
    """With 4 requests at once and answers finishing in random order, every output keeps its input's order."""
    for name in ("a", "b", "c"):
        job.write(f"{name}.txt", b"".join(b"%s%04d\n" % (name.encode(), i) for i in range(200)))
    options = ("--split-type", "Line", "--batch-strategy", "SingleRecord", "--assemble-with", "Line")
    result = job.run(*options, "--max-concurrent-transforms", "4", env={"CALL_DELAY": "0.004"})
    assert result.returncode == 0, result.stderr
    for name in ("a", "b", "c"):
        assert job.out(f"{name}.txt") == b"".join(b"%s%04d\n" % (name.upper().encode(), i) for i in range(200))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--max-payload-in-mb", "101"), "max payload 101 MB: SageMaker allows 0 (no limit) to 100"),
        (("--max-payload-in-mb", "20", "--max-concurrent-transforms", "6"), "6 x 20 MB = 120 MB"),
        (("--max-concurrent-transforms", "0"), "max concurrent transforms 0: at least 1"),
    ],
)
def test_sagemakers_bounds_are_checked_before_anything_runs(job: Job, options: tuple[str, ...], message: str) -> None:
    """Payload over 100 MB, or concurrency x payload over 100 MB: exit 2 with the rule, no request made."""
    job.write("a.csv", b"1\n")
    result = job.run(*options)
    assert result.returncode == 2
    assert message in result.stderr
    assert job.calls() == []


def test_resume_after_a_killed_run_completes_only_what_is_missing(job: Job) -> None:
    """SIGKILL mid-job leaves no finished-looking output (only .incomplete); --resume skips the finished files and
    redoes the rest; the outputs equal a clean run's."""
    for i in range(6):
        job.write(f"f{i}.txt", b"".join(b"%d-%04d\n" % (i, n) for n in range(40)))
    options = ("--split-type", "Line", "--batch-strategy", "SingleRecord", "--assemble-with", "Line")
    process = subprocess.Popen(job.command(*options), env={**job.env, "CALL_DELAY": "0.02"}, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(job.calls()) < 60 and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    finished = sorted(p.name for p in job.output.glob("*.out"))
    assert len(finished) < 6
    for out in finished:  # what looks finished is finished
        index = int(out[1])
        assert (job.output / out).read_bytes() == b"".join(b"%d-%04d\n" % (index, n) for n in range(40))
    calls_before = len(job.calls())
    result = job.run(*options, "--resume")
    assert result.returncode == 0, result.stderr
    assert f"({len(finished)} skipped, 0 failed)" in result.stderr
    assert len(job.calls()) - calls_before == (6 - len(finished)) * 40
    for i in range(6):
        assert job.out(f"f{i}.txt") == b"".join(b"%d-%04d\n" % (i, n) for n in range(40))
    assert not list(job.output.glob("*.incomplete"))
    os.utime(job.input / "f0.txt")  # an input newer than its output is done again
    assert "(5 skipped" in job.run(*options, "--resume").stderr
    calls_before = len(job.calls())
    nothing_left = job.run(*options, "--resume", env={"CALLS_LOG": str(job.log), "INFERENCE_SERVER_MODEL_DIR": ""})
    assert nothing_left.returncode == 0, nothing_left.stderr
    assert "(6 skipped, 0 failed)" in nothing_left.stderr
    assert "Loading the model" not in nothing_left.stderr  # nothing left to do: the model is not loaded
    assert len(job.calls()) == calls_before


def test_filters_and_join_on_csv_as_sagemaker_documents_them(job: Job) -> None:
    """InputFilter $[1:] drops the ID column before the model; JoinSource Input and OutputFilter $[0,-1] write the
    ID beside the answer, one line per record, with MultiRecord requests split back by line."""
    job.write("a.csv", b"id1,x,1\nid2,y,2\nid3,z,3\n")
    options = ("--content-type", "text/csv", "--split-type", "Line", "--batch-strategy", "MultiRecord")
    result = job.run(*options, "--input-filter", "$[1:]", "--join-source", "Input", "--output-filter", "$[0,-1]")
    assert result.returncode == 0, result.stderr
    assert job.calls() == [len(b"x,1\ny,2\nz,3\n")]
    assert job.out("a.csv") == b"id1,1\nid2,2\nid3,3\n"


def test_a_join_needs_an_answer_line_per_record(job: Job) -> None:
    """An answer with fewer lines than its request's records fails the file, saying how many of each."""
    job.write("a.csv", b"1\n2\n3\n")
    options = ("--content-type", "text/csv", "--split-type", "Line", "--join-source", "Input")
    result = job.run(*options, env={"FIRST_LINE_ONLY": "1"})
    assert result.returncode == 1
    assert "a.csv: the answer to records 0 to 2 has 1 lines for 3 records" in result.stderr


def test_filters_outside_line_or_none_splits_are_refused(job: Job) -> None:
    """Filters on RecordIO or TFRecord records: exit 2 before anything runs."""
    job.write("a.rec", b"")
    result = job.run("--content-type", "text/csv", "--split-type", "RecordIO", "--input-filter", "$[1:]")
    assert result.returncode == 2
    assert "need SplitType Line or None" in result.stderr


def test_a_progress_bar_on_a_terminal_and_none_in_a_file(job: Job) -> None:
    """stderr a terminal (a pseudo-TTY): a progress bar with bytes, records and the total; a file: no bar, only the
    summary; --quiet: neither (warnings still show)."""
    job.write("a.csv", b"".join(b"%05d\n" % i for i in range(2000)))
    options = ("--split-type", "Line", "--batch-strategy", "SingleRecord", "--max-concurrent-transforms", "2")
    main, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            job.command(*options), env=job.env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal
        )
        os.close(terminal)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once the child has closed the terminal
            while chunk := os.read(main, 65536):
                shown += chunk
        assert process.wait(60) == 0
    finally:
        os.close(main)
    assert b"transform: 100%" in shown
    assert b"2000 records" in shown
    assert b"11.7k/11.7k" in shown  # bytes of the inputs' total
    in_a_file = job.run(*options)
    assert "transform: " not in in_a_file.stderr.replace("inference-server transform", "")
    assert "2000 records in 2000 requests" in in_a_file.stderr
    quiet = job.run(*options, "--quiet")
    assert "transform" not in quiet.stderr.lower().replace("inference_server", "")
    assert "records" not in quiet.stderr


def _peak_rss_mb(job: Job, *options: str) -> float:
    """Run the job; the peak resident memory of its process in MB (from wait4: that child's own)."""
    with (job.tmp_path / "stderr.txt").open("w+") as stderr:
        process = subprocess.Popen(
            job.command(*options), env={**job.env, "FIRST_LINE_ONLY": "1"}, stdout=subprocess.DEVNULL, stderr=stderr
        )
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        stderr.seek(0)
        assert process.returncode == 0, stderr.read()
    return usage.ru_maxrss / 1024


def test_a_200_mb_file_streams_in_the_memory_of_a_20_mb_one(job: Job) -> None:
    """SplitType Line: a 200 MB CSV goes through with a peak RSS within 25 MB of a 20 MB one's (records are read
    as a stream and at most 2 x MaxConcurrentTransforms bodies are held), not 180 MB more."""
    line = b"%s\n" % b",".join(b"%06d" % i for i in range(14))  # 98 bytes
    block = line * 10_000  # about 1 MB
    options = ("--split-type", "Line", "--batch-strategy", "MultiRecord", "--max-payload-in-mb", "6")
    options += ("--max-concurrent-transforms", "2", "--assemble-with", "Line")
    peaks = {}
    for megabytes in (20, 200):
        path = job.input / "data.csv"
        with path.open("wb") as sink:
            for _ in range(megabytes):
                sink.write(block)
        peaks[megabytes] = _peak_rss_mb(job, *options)
        assert job.out("data.csv").count(b"\n") == len(job.calls()), "one first line per request"
        job.log.unlink()
    (job.input / "data.csv").unlink()
    assert peaks[200] - peaks[20] < 25, peaks


def test_a_model_that_fails_to_load_from_the_default_directory_names_the_option(
    tmp_path: Path, servers: Any, plugin_site: Any
) -> None:
    """A job whose model_fn fails without --model-dir, where /opt/ml/model does not exist: the error says that
    --model-dir chooses the directory, in one process or in the job's worker processes, and nothing of a server
    (/ping) is mentioned."""
    plugin_site.add(
        "needs_files",
        """
        import os

        import inference_server

        @inference_server.plugin_hook
        def model_fn(model_dir):
            return open(os.path.join(model_dir, "weights.bin"), "rb")
        """,
    )
    if Path("/opt/ml/model").exists():
        pytest.skip("this machine has a /opt/ml/model")
    job = Job(tmp_path, servers)
    job.write("a.txt", b"x")
    result = job.run()
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "inference-server transform: error: the model failed to load: FileNotFoundError: [Errno 2] No such file or "
        "directory: '/opt/ml/model/weights.bin' (from /opt/ml/model, which does not exist: --model-dir chooses the "
        "model's directory)"
    )
    assert "/ping" not in result.stderr
    in_processes = job.run("--workers", "2")  # the model fails to load in the job's worker processes
    assert in_processes.returncode == 1
    hints = [line for line in in_processes.stderr.splitlines() if line.startswith("hint: ")]
    assert hints == ["hint: from /opt/ml/model, which does not exist: --model-dir chooses the model's directory"]
