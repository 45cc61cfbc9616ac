"""Data capture: SageMaker's JSON Lines records, written to a local directory or to S3 (a real moto server on a free
port of 127.0.0.1), in SageMaker's layout, from a bounded buffer that never fails a request."""

from __future__ import annotations

import base64
import calendar
import json
import logging
import math
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inference_server._capture import RECORD_BYTES, Capture
from inference_server.errors import ConfigurationError
from tests.conftest import local_aws_env, wait_until

#: 2022-02-14T17:25:49.648Z, the inference time of most records here.
WHEN = calendar.timegm((2022, 2, 14, 17, 25, 49)) + 0.648
NAME = re.compile(r"(\d\d)-(\d\d)-(\d\d\d)-([0-9a-f-]{36})\.jsonl")
CSV = ("text/csv", b"1,2,3\n")

Make = Callable[..., Capture]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    """``make(**options)``: a Capture to ``tmp_path/"capture"`` for endpoint ``my-endpoint``, capturing everything,
    whose writer thread does not flush on its own (the test calls ``flush()``); closed at the test's end."""
    made: list[Capture] = []

    def make(destination: str | Path | None = None, **options: Any) -> Capture:
        settings: dict[str, Any] = {"sampling": 100, "mode": "both", "endpoint": "my-endpoint", "flush_seconds": 3600}
        capture = Capture(str(destination or tmp_path / "capture"), **{**settings, **options})
        made.append(capture)
        return capture

    yield make
    for capture in made:
        capture.close()


def files(root: Path) -> list[Path]:
    """The capture files under ``root``, sorted by path."""
    return sorted(root.rglob("*.jsonl"))


def lines(path: Path | bytes) -> list[dict[str, Any]]:
    """The records of one JSON Lines file (or its bytes), each line whole."""
    data = path.read_bytes() if isinstance(path, Path) else path
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def records(root: Path) -> list[dict[str, Any]]:
    """Every record under ``root``, file by file."""
    return [record for path in files(root) for record in lines(path)]


def line_size(tmp_path: Path) -> int:
    """The size in bytes of the line of ``record(input=CSV, output=None, inference_id="0", when=WHEN)``."""
    capture = Capture(str(tmp_path / "measure"), sampling=100, mode="input", endpoint="e", flush_seconds=3600)
    capture.record(input=CSV, output=None, inference_id="0", when=WHEN)
    capture.close()
    (path,) = files(tmp_path / "measure")
    return path.stat().st_size


#: What ``record(input=CSV, output=None, ...)`` holds of the buffer until its line is made: its body's copy and
#: RECORD_BYTES for the rest.
HELD = len(CSV[1]) + RECORD_BYTES


def test_a_record_has_exactly_sagemakers_fields(make: Make, tmp_path: Path) -> None:
    """A record is SageMaker's object: captureData with both sides, eventMetadata with a uuid4 eventId and the UTC
    inference time to the second, eventVersion "0"; content types observed as given."""
    capture = make()
    capture.record(input=CSV, output=("text/csv; charset=utf-8", b"0.25"), when=WHEN)
    capture.flush()
    (record,) = records(tmp_path / "capture")
    event_id = record["eventMetadata"]["eventId"]
    assert uuid.UUID(event_id).version == 4
    assert record == {
        "captureData": {
            "endpointInput": {"observedContentType": "text/csv", "mode": "INPUT", "data": "1,2,3\n", "encoding": "CSV"},
            "endpointOutput": {
                "observedContentType": "text/csv; charset=utf-8",
                "mode": "OUTPUT",
                "data": "0.25",
                "encoding": "CSV",
            },
        },
        "eventMetadata": {"eventId": event_id, "inferenceTime": "2022-02-14T17:25:49Z"},
        "eventVersion": "0",
    }
    assert (capture.captured, capture.written, capture.dropped) == (1, 1, 0)


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\x00"


@pytest.mark.parametrize(
    ("content_type", "body", "encoding", "data"),
    [
        ("text/csv", b"1,2\n3,4\n", "CSV", "1,2\n3,4\n"),
        ("Text/CSV; charset=UTF-8", b"1,2", "CSV", "1,2"),
        ("application/json", '{"a": [1, "é"]}'.encode(), "JSON", '{"a": [1, "é"]}'),
        ("application/json; charset=utf-8", bytearray(b"[1]"), "JSON", "[1]"),
        ("application/json", memoryview(b"[2]"), "JSON", "[2]"),
        ("image/png", PNG, "BASE64", None),
        ("application/jsonlines", b'{"a": 1}\n', "BASE64", None),
        ("text/csv", b"\xff\xfe1,2", "BASE64", None),
        (None, b"\x00\x01\x02", "BASE64", None),
    ],
)
def test_bodies_are_encoded_by_their_media_type(
    make: Make, tmp_path: Path, content_type: str | None, body: bytes, encoding: str, data: str | None
) -> None:
    """A CSV or JSON media type (parameters and case ignored) keeps the body as text; any other type, a body that is
    not UTF-8, or no content type (observed as application/octet-stream) is base64 that decodes to the body."""
    capture = make(mode="input")
    capture.record(input=(content_type, body), output=None, when=WHEN)
    capture.flush()
    (record,) = records(tmp_path / "capture")
    captured = record["captureData"]["endpointInput"]
    assert captured["observedContentType"] == (content_type or "application/octet-stream")
    assert captured["encoding"] == encoding
    if encoding == "BASE64":
        assert base64.b64decode(captured["data"], validate=True) == bytes(body)
    else:
        assert captured["data"] == data


def test_the_content_type_lists_are_the_callers(make: Make, tmp_path: Path) -> None:
    """csv_types and json_types replace the defaults: text/csv is then base64."""
    capture = make(csv_types=["text/plain"], json_types=["application/jsonlines"])
    capture.record(input=("text/plain; charset=utf-8", b"a,b"), output=("application/jsonlines", b"{}\n"), when=WHEN)
    capture.record(input=CSV, output=None, when=WHEN)
    capture.flush()
    first, second = records(tmp_path / "capture")
    assert first["captureData"]["endpointInput"]["encoding"] == "CSV"
    assert first["captureData"]["endpointOutput"]["encoding"] == "JSON"
    assert second["captureData"]["endpointInput"]["encoding"] == "BASE64"


@pytest.mark.parametrize(
    ("mode", "keys"),
    [("input", ["endpointInput"]), ("output", ["endpointOutput"]), ("both", ["endpointInput", "endpointOutput"])],
)
def test_the_mode_chooses_the_sides_captured(make: Make, tmp_path: Path, mode: str, keys: list[str]) -> None:
    """Mode input writes only endpointInput, output only endpointOutput, both both; the other key is left out."""
    capture = make(mode=mode)
    capture.record(input=CSV, output=("application/json", b"[0.5]"), when=WHEN)
    capture.flush()
    (record,) = records(tmp_path / "capture")
    assert sorted(record["captureData"]) == keys


def test_nothing_to_capture_in_the_mode_writes_nothing(make: Make, tmp_path: Path) -> None:
    """A request without a response, in mode output, is no record at all (not an empty captureData)."""
    capture = make(mode="output")
    capture.record(input=CSV, output=None, when=WHEN)
    capture.flush()
    assert files(tmp_path / "capture") == []
    assert (capture.captured, capture.dropped, capture.record_errors) == (0, 0, 0)


def test_inference_id_and_custom_attributes_only_when_given(make: Make, tmp_path: Path) -> None:
    """eventMetadata has inferenceId and customAttributes only for a record given them."""
    capture = make()
    capture.record(input=CSV, output=None, inference_id="abc-1", custom_attributes="trace=7", when=WHEN)
    capture.record(input=CSV, output=None, inference_id="abc-2", when=WHEN)
    capture.record(input=CSV, output=None, custom_attributes="", when=WHEN)
    capture.record(input=CSV, output=None, when=WHEN)
    capture.flush()
    metadata = [record["eventMetadata"] for record in records(tmp_path / "capture")]
    assert [sorted(m) for m in metadata] == [
        ["customAttributes", "eventId", "inferenceId", "inferenceTime"],
        ["eventId", "inferenceId", "inferenceTime"],
        ["customAttributes", "eventId", "inferenceTime"],
        ["eventId", "inferenceTime"],
    ]
    assert (metadata[0]["inferenceId"], metadata[0]["customAttributes"]) == ("abc-1", "trace=7")
    assert len({m["eventId"] for m in metadata}) == 4


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_the_folder_layout_and_file_name(make: Make, tmp_path: Path, scheme: str) -> None:
    """Files are <destination>/<endpoint>/<variant>/yyyy/mm/dd/hh/MM-SS-mmm-<uuid4>.jsonl, by the UTC time of the
    first record, which is the clock's when the record gives no time; a file:// destination is the directory."""
    capture = make(f"{scheme}{tmp_path / 'capture'}", variant="Canary", clock=lambda: WHEN)
    capture.record(input=CSV, output=None)
    capture.flush()
    (path,) = files(tmp_path / "capture")
    relative = path.relative_to(tmp_path / "capture")
    assert relative.parent.as_posix() == "my-endpoint/Canary/2022/02/14/17"
    match = NAME.fullmatch(relative.name)
    assert match is not None
    assert match.group(1, 2, 3) == ("25", "49", "648")
    assert uuid.UUID(match.group(4)).version == 4
    assert lines(path)[0]["eventMetadata"]["inferenceTime"] == "2022-02-14T17:25:49Z"


def test_each_flush_appends_to_the_hours_file(make: Make, tmp_path: Path) -> None:
    """Locally, the flushes of one hour append to one file, in order, each line whole."""
    capture = make()
    for flush in range(3):
        capture.record(input=CSV, output=None, inference_id=str(flush), when=WHEN + flush)
        capture.flush()
    (path,) = files(tmp_path / "capture")
    assert [record["eventMetadata"]["inferenceId"] for record in lines(path)] == ["0", "1", "2"]


def test_a_new_hour_starts_a_new_file(make: Make, tmp_path: Path) -> None:
    """Records of different UTC hours go to different hour folders, within one flush and across flushes."""
    now = [calendar.timegm((2022, 2, 14, 17, 59, 59)) + 0.5]
    capture = make(clock=lambda: now[0])
    capture.record(input=CSV, output=None, inference_id="a")
    now[0] += 0.7  # 18:00:00.200
    capture.record(input=CSV, output=None, inference_id="b")
    capture.flush()
    now[0] += 1
    capture.record(input=CSV, output=None, inference_id="c")
    capture.record(input=CSV, output=None, inference_id="d", when=now[0] - 3600)  # late, of the hour before
    capture.flush()
    found = {path.relative_to(tmp_path / "capture").as_posix(): lines(path) for path in files(tmp_path / "capture")}
    by_folder = {name.rsplit("/", 1)[0]: name.rsplit("/", 1)[1] for name in found}
    assert sorted(by_folder) == ["my-endpoint/AllTraffic/2022/02/14/17", "my-endpoint/AllTraffic/2022/02/14/18"]
    assert by_folder["my-endpoint/AllTraffic/2022/02/14/17"].startswith("59-59-500-")
    assert by_folder["my-endpoint/AllTraffic/2022/02/14/18"].startswith("00-00-200-")
    ids = {name: [r["eventMetadata"]["inferenceId"] for r in records] for name, records in found.items()}
    assert sorted(ids.values()) == [["a", "d"], ["b", "c"]]


def test_a_file_is_rotated_past_max_file_bytes(make: Make, tmp_path: Path) -> None:
    """A file is appended to until the next lines would pass max_file_bytes, then a new one starts; only a record
    larger than the limit alone passes it, in a file of its own; the records stay in order across the files."""
    size = line_size(tmp_path)
    capture = make(mode="input", max_file_bytes=3 * size + 10)
    for index in range(7):
        capture.record(input=CSV, output=None, inference_id=str(index), when=WHEN + index / 1000)
    capture.flush()
    for index in range(7, 9):
        capture.record(input=CSV, output=None, inference_id=str(index), when=WHEN + index / 1000)
        capture.flush()
    capture.record(input=("text/csv", b"9" * 4 * size), output=None, inference_id="9", when=WHEN + 0.009)
    capture.flush()
    capture.record(input=CSV, output=None, inference_id="x", when=WHEN + 0.010)
    capture.flush()
    found = files(tmp_path / "capture")
    found.sort(key=lambda path: path.name[:9])  # by the millisecond of the first record
    assert [len(lines(path)) for path in found] == [3, 3, 3, 1, 1]
    assert [path.stat().st_size <= 3 * size + 10 for path in found] == [True, True, True, False, True]
    ids = [record["eventMetadata"]["inferenceId"] for path in found for record in lines(path)]
    assert ids == [*map(str, range(10)), "x"]


def test_sampling_is_the_percentage_within_binomial_bounds(make: Make) -> None:
    """At 30%, 10,000 calls sample 3,000 give or take 5 sigma; 0% never samples and 100% always does."""
    calls, p = 10_000, 0.3
    sampled = sum(make(sampling=30).sampled() for _ in range(calls))
    assert abs(sampled - calls * p) <= 5 * math.sqrt(calls * p * (1 - p))
    assert not any(make(sampling=0).sampled() for _ in range(1000))
    assert all(make(sampling=100).sampled() for _ in range(1000))


def test_a_full_buffer_drops_counts_and_warns_once(
    make: Make, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past max_buffer_bytes records are dropped and counted, with one warning saying what to do; close() writes
    those kept and reports the drops not yet warned about."""
    capture = make(mode="input", max_buffer_bytes=2 * HELD + HELD // 2)
    with caplog.at_level(logging.WARNING, logger="inference_server"):
        for index in range(20):
            capture.record(input=CSV, output=None, inference_id=str(index % 10), when=WHEN)
        warnings = [record.getMessage() for record in caplog.records]
        assert (capture.captured, capture.dropped, capture.written) == (2, 18, 0)
        assert len(warnings) == 1
        assert "1 since the last warning, 1 in all" in warnings[0]
        assert "lower the sampling percentage" in warnings[0]
        capture.close()
    assert len(records(tmp_path / "capture")) == 2
    assert capture.written == 2
    assert "17 since the last warning, 18 in all" in caplog.records[-1].getMessage()


def test_close_writes_what_is_buffered_and_stops_the_writer(make: Make, tmp_path: Path) -> None:
    """close() writes every buffered record and stops the "data-capture" daemon thread; again it does nothing, and a
    record after it is dropped and counted."""
    capture = make()
    for _ in range(5):
        capture.record(input=CSV, output=None, when=WHEN)
    (writer,) = [thread for thread in threading.enumerate() if thread.name == "data-capture"]
    assert writer.daemon
    capture.close()
    assert len(records(tmp_path / "capture")) == 5
    assert not writer.is_alive()
    capture.close()
    capture.record(input=CSV, output=None, when=WHEN)
    assert (capture.captured, capture.written, capture.dropped) == (5, 5, 1)
    assert len(records(tmp_path / "capture")) == 5


def test_the_writer_thread_writes_every_flush_seconds(make: Make, tmp_path: Path) -> None:
    """Without flush() or close(), the writer thread writes the buffered records within flush_seconds."""
    capture = make(flush_seconds=0.05)
    capture.record(input=CSV, output=None, when=WHEN)
    wait_until(lambda: capture.written == 1, 5, "the writer thread wrote nothing")
    assert len(records(tmp_path / "capture")) == 1


def test_a_failing_destination_keeps_the_records_to_retry(
    make: Make, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write that fails (here the destination is a file, not a directory) is counted and logged once a minute, and
    its records are written once the destination works."""
    blocked = tmp_path / "capture"
    blocked.write_bytes(b"")
    capture = make(blocked)
    with caplog.at_level(logging.ERROR, logger="inference_server"):
        for _ in range(3):
            capture.record(input=CSV, output=None, when=WHEN)
        capture.flush()
        capture.flush()
    assert (capture.write_errors, capture.written, capture.dropped) == (2, 0, 0)
    (error,) = caplog.records
    assert error.levelno == logging.ERROR
    assert "kept to retry" in error.getMessage()
    blocked.unlink()
    capture.flush()
    assert (capture.written, len(records(blocked))) == (3, 3)


class _RecordOnError(logging.Handler):
    """Records ``count`` requests into ``capture`` when the first error is logged: requests that arrive while a write
    is failing."""

    def __init__(self, capture: Capture, count: int) -> None:
        super().__init__(logging.ERROR)
        self.capture, self.count = capture, count

    def emit(self, record: logging.LogRecord) -> None:
        for index in range(self.count):
            self.capture.record(input=CSV, output=None, inference_id=str(3 + index), when=WHEN)
        self.count = 0


def test_records_kept_to_retry_stay_bounded_dropping_the_oldest(make: Make, tmp_path: Path) -> None:
    """When records that arrived during a failing write join those kept to retry past max_buffer_bytes, the oldest
    are dropped and counted."""
    size = line_size(tmp_path)
    blocked = tmp_path / "capture"
    blocked.write_bytes(b"")
    bound = 3 * HELD + HELD // 2
    capture = make(blocked, mode="input", max_buffer_bytes=bound)
    for index in range(3):
        capture.record(input=CSV, output=None, inference_id=str(index), when=WHEN)
    handler = _RecordOnError(capture, 2)
    logging.getLogger("inference_server").addHandler(handler)
    try:
        capture.flush()
    finally:
        logging.getLogger("inference_server").removeHandler(handler)
    # the three lines made for the failed write go back before the two records (held, not yet made) that came
    # meanwhile; the oldest are dropped until what is left fits
    held = [size] * 3 + [HELD] * 2
    while sum(held) > bound:
        held.pop(0)
    dropped = 5 - len(held)
    assert dropped >= 1
    assert (capture.captured, capture.dropped, capture.write_errors) == (5, dropped, 1)
    blocked.unlink()
    capture.flush()
    kept = [record["eventMetadata"]["inferenceId"] for record in records(blocked)]
    assert kept == [str(index) for index in range(dropped, 5)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE cuts writes short as Linux does")
def test_a_write_cut_short_leaves_only_whole_lines(make: Make, tmp_path: Path) -> None:
    """A write that fails midway (the file size limit, as a full disk would) is cut back to the last whole line, and
    its records are written whole by the retry."""
    import resource

    capture = make(mode="input")
    capture.record(input=CSV, output=None, inference_id="0", when=WHEN)
    capture.flush()
    (path,) = files(tmp_path / "capture")
    written = path.stat().st_size
    for index in range(1, 4):
        capture.record(input=CSV, output=None, inference_id=str(index), when=WHEN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() fails with EFBIG instead
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (written + written * 3 // 2, hard))
        capture.flush()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert capture.write_errors == 1
    assert path.stat().st_size == written
    capture.flush()
    assert [record["eventMetadata"]["inferenceId"] for record in lines(path)] == ["0", "1", "2", "3"]


def test_bad_data_is_logged_and_counted_never_raised(make: Make, caplog: pytest.LogCaptureFixture) -> None:
    """A record that cannot be built (a body that is not bytes) raises nothing: it is counted in record_errors and
    logged with its traceback once a minute."""
    capture = make()
    with caplog.at_level(logging.ERROR, logger="inference_server"):
        capture.record(input=("text/csv", 12345), output=None)  # type: ignore[arg-type]
        capture.record(input=None, output=("image/png", object()))  # type: ignore[arg-type]
    assert (capture.record_errors, capture.captured) == (2, 0)
    (error,) = caplog.records
    assert error.exc_info is not None
    capture.record(input=CSV, output=None)
    assert capture.captured == 1


@pytest.mark.parametrize(
    "options",
    [
        {"sampling": 101},
        {"sampling": -1},
        {"mode": "InputAndOutput"},
        {"endpoint": ""},
        {"variant": "a/b"},
        {"max_buffer_bytes": 0},
        {"max_file_bytes": -1},
        {"flush_seconds": 0},
        {"csv_types": ["text/csv"], "json_types": ["Text/CSV"]},
        {"destination": "nope://bucket/prefix"},
    ],
)
def test_bad_settings_are_configuration_errors(tmp_path: Path, options: dict[str, Any]) -> None:
    """Each bad setting is a ConfigurationError at construction, naming the setting or destination."""
    settings: dict[str, Any] = {"destination": str(tmp_path), "sampling": 10, "mode": "both", "endpoint": "e"}
    settings.update(options)
    with pytest.raises(ConfigurationError):
        Capture(**settings)


def test_s3_without_the_extra_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """An s3:// destination without fsspec is a ConfigurationError naming the [s3] extra."""
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(ConfigurationError, match=re.escape("pip install 'inference-server[s3]'")):
        Capture("s3://capture/prefix", sampling=10, mode="both", endpoint="e")


@pytest.fixture
def s3_env(s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The local S3 server (a bucket ``capture`` added), which s3fs reaches through ``AWS_ENDPOINT_URL_S3``."""
    for name, value in {**local_aws_env("http://unused"), "AWS_ENDPOINT_URL_S3": s3.endpoint}.items():
        monkeypatch.setenv(name, value)
    s3.create_bucket(Bucket="capture")
    return s3


def test_s3_gets_a_new_object_for_each_flush(s3_env: Any, make: Make) -> None:
    """To s3://, each flush writes new objects in SageMaker's layout (objects are not appended to), readable with
    boto3 as the same JSON Lines."""
    capture = make("s3://capture/data-capture")
    capture.record(input=CSV, output=("application/json", b"[1]"), inference_id="a", when=WHEN)
    capture.record(input=CSV, output=None, inference_id="b", when=WHEN + 1)
    capture.flush()
    capture.record(input=("image/png", PNG), output=None, inference_id="c", when=WHEN + 2)
    capture.close()
    s3 = s3_env
    listed = s3.list_objects_v2(Bucket="capture", Prefix="data-capture/")["Contents"]
    keys = sorted((item["Key"] for item in listed), key=lambda key: key.rsplit("/", 1)[1][:9])
    assert [key.rsplit("/", 1)[0] for key in keys] == ["data-capture/my-endpoint/AllTraffic/2022/02/14/17"] * 2
    assert [NAME.fullmatch(key.rsplit("/", 1)[1]) is not None for key in keys] == [True, True]
    assert keys[0].rsplit("/", 1)[1].startswith("25-49-648-")
    found = [lines(s3.get_object(Bucket="capture", Key=key)["Body"].read()) for key in keys]
    assert [[r["eventMetadata"]["inferenceId"] for r in records] for records in found] == [["a", "b"], ["c"]]
    image = found[1][0]["captureData"]["endpointInput"]
    assert (image["encoding"], base64.b64decode(image["data"])) == ("BASE64", PNG)
    assert (capture.written, capture.write_errors) == (3, 0)


#: A model for the server's tests: the body echoed with its own media type, or streamed in three chunks.
ECHO = """
    import inference_server

    @inference_server.plugin_hook
    def input_fn(input_data, content_type):
        return bytes(input_data), content_type

    @inference_server.plugin_hook
    def predict_fn(data, model):
        body, content_type = data
        if body == b"stream":
            return (part for part in (b"one,", b"two,", b"three"))
        return body, content_type

    @inference_server.plugin_hook
    def output_fn(prediction, accept):
        if isinstance(prediction, tuple):
            return prediction[0], prediction[1]
        return prediction, "text/csv"
"""


def _records(root: Path) -> list[dict[str, Any]]:
    return [record for path in sorted(root.rglob("*.jsonl")) for record in lines(path.read_bytes())]


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_a_server_captures_every_invocation_and_flushes_on_sigterm(
    servers: Any, plugin_site: Any, tmp_path: Path, backend: str
) -> None:
    """serve --data-capture writes SageMaker's records of /invocations (CSV and JSON as text, binary as base64, the
    inference id and custom attributes kept), of SageMaker Runtime's route, and of a streamed answer (its chunks
    joined), under ENDPOINT/VARIANT/yyyy/mm/dd/hh; what is buffered is written when SIGTERM stops the server, and
    /metrics counts the records."""
    plugin_site.add("echo_capture", ECHO)
    root = tmp_path / "capture"
    server = servers.start(
        *("--server", backend, "--data-capture", str(root)),
        *("--data-capture-endpoint", "shipping", "--data-capture-variant", "blue"),
        *("--data-capture-flush-seconds", "3600"),  # (nothing written before SIGTERM)
    )
    headers = {"X-Amzn-SageMaker-Inference-Id": "csv-1", "X-Amzn-SageMaker-Custom-Attributes": "trace=7"}
    assert server.request("POST", "/invocations", b"1,2\n", {**headers, "Content-Type": "text/csv"}).status == 200
    json_body = b'{"a": [1, 2]}'
    reply = server.request("POST", "/endpoints/shipping/invocations", json_body, {"Content-Type": "application/json"})
    assert reply.status == 200
    assert server.request("POST", "/invocations", PNG, {"Content-Type": "image/png"}).status == 200
    streamed = server.request("POST", "/invocations", b"stream", {"Content-Type": "text/plain"})
    assert streamed.body == b"one,two,three"
    refused = server.request("POST", "/invocations", b"", {"Content-Type": "text/plain", "Content-Encoding": "br"})
    assert refused.status == 415  # (not answered by the model: not captured)
    wait_until(
        lambda: server.metric("inference_server_data_capture_records_total", outcome="captured") >= 4, 30, "uncounted"
    )
    assert _records(root) == []
    assert server.stop() == 0
    records = _records(root)
    assert len(records) == 4
    folders = {path.parent.relative_to(root).parts[:2] for path in root.rglob("*.jsonl")}
    assert folders == {("shipping", "blue")}
    by_input = {record["captureData"]["endpointInput"]["data"]: record for record in records}
    csv = by_input["1,2\n"]
    assert csv["captureData"]["endpointInput"] == {
        "observedContentType": "text/csv",
        "mode": "INPUT",
        "data": "1,2\n",
        "encoding": "CSV",
    }
    assert csv["captureData"]["endpointOutput"]["encoding"] == "CSV"
    assert csv["eventMetadata"]["inferenceId"] == "csv-1"
    assert csv["eventMetadata"]["customAttributes"] == "trace=7"
    assert csv["eventVersion"] == "0"
    as_json = by_input[json_body.decode()]["captureData"]
    assert as_json["endpointInput"]["encoding"] == as_json["endpointOutput"]["encoding"] == "JSON"
    image = by_input[base64.b64encode(PNG).decode()]["captureData"]
    assert image["endpointInput"]["encoding"] == image["endpointOutput"]["encoding"] == "BASE64"
    stream = by_input[base64.b64encode(b"stream").decode()]["captureData"]["endpointOutput"]
    assert (stream["data"], stream["encoding"]) == ("one,two,three", "CSV")


def test_a_stream_larger_than_the_buffer_is_let_go_as_it_passes(make: Make) -> None:
    """A streamed answer is kept chunk by chunk only up to max_buffer_bytes: past it its chunks are let go at once
    and its record dropped and counted, not joined first; a smaller one is captured whole once it ends."""
    from inference_server._pipeline import Output, Stream

    capture = make(max_buffer_bytes=1000 + RECORD_BYTES)
    environ = {"CONTENT_TYPE": "text/plain"}
    large = Stream(iter([b"b" * 400, b"c" * 400, b"d" * 400]))
    capture.invocation(environ, b"in", Output([b"a" * 400], "text/plain", [], large))
    assert large.next() is not None
    assert large.next() is not None  # (1,200 bytes kept)
    assert large.captured is not None
    assert large.next() is not None  # (1,600: past the bound)
    assert (large.captured, capture.dropped) == (None, 1)
    assert large.next() is None
    small = Stream(iter([b"y" * 10]))
    capture.invocation(environ, b"in", Output([b"x" * 10], "text/plain", [], small))
    while small.next() is not None:
        pass
    capture.close()
    assert (capture.captured, capture.dropped) == (1, 1)


def test_sampling_of_10000_requests_to_the_app(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--data-capture-sampling 30 on 10,000 real invocations of the app (in process, through its WSGI interface):
    the records written are 30% of them, within five standard deviations, each of a request that was answered."""
    from inference_server import testing

    monkeypatch.setenv("INFERENCE_SERVER_DATA_CAPTURE", str(tmp_path / "capture"))
    monkeypatch.setenv("INFERENCE_SERVER_DATA_CAPTURE_SAMPLING", "30")
    monkeypatch.setenv("INFERENCE_SERVER_METRICS", "false")
    monkeypatch.setenv("INFERENCE_SERVER_ACCESS_LOG", "false")
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "")  # (the built-in echo model alone)
    testing.reset()
    app = testing.client()
    count = 10_000
    for index in range(count):
        answer = app.post("/invocations", data=f"{index}\n".encode(), content_type="text/csv")
        assert answer.status_code == 200
    captures = app.application.lifecycle.captures  # type: ignore[attr-defined]
    captures.close()
    found = _records(tmp_path / "capture")
    sigma = math.sqrt(count * 0.3 * 0.7)
    assert abs(len(found) - count * 0.3) < 5 * sigma, len(found)
    inputs = {int(record["captureData"]["endpointInput"]["data"]) for record in found}
    assert len(inputs) == len(found)
    assert inputs <= set(range(count))
