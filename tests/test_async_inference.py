"""SageMaker Asynchronous Inference on a real server: boto3's ``invoke_endpoint_async`` against ``serve
--async-output``, inputs and answers in a real local S3 server (moto's) or in local directories, notifications
received by a real HTTP listener, the durable queue across SIGKILL and restarts."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import re
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import pytest

from tests.conftest import S3_CREDENTIALS, local_aws_env, wait_until

#: A model whose calls are logged (the body, once the call is done), that sleeps SLEEP seconds, fails on ``boom``
#: with a 500 and answers the body upper-cased as text/plain.
LOGGED = """
    import os
    import time

    import inference_server

    @inference_server.plugin_hook
    def input_fn(input_data, content_type):
        return bytes(input_data)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if data.startswith(b"boom"):
            raise ValueError("asked to fail")
        time.sleep(float(os.environ.get("SLEEP", "0")))
        with open(os.environ["CALLS_LOG"], "a") as log:
            log.write(data.decode() + "\\n")
        return data.upper()

    @inference_server.plugin_hook
    def output_fn(prediction, accept):
        return prediction, "text/plain"
"""


class Listener:
    """A real HTTP server on 127.0.0.1 that keeps the JSON bodies POSTed to it (the notifications)."""

    def __init__(self) -> None:
        received: list[tuple[str, Any]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.received = received
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    """A notification listener, stopped at the end of the test."""
    found = Listener()
    try:
        yield found
    finally:
        found.close()


def _runtime(server: Any, retries: int = 1) -> Any:
    """boto3's SageMaker Runtime client for ``server`` (``retries``: attempts in all)."""
    config = botocore.config.Config(retries={"total_max_attempts": retries, "mode": "standard"})
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=f"http://127.0.0.1:{server.port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=config,
    )


def _serve(servers: Any, plugin_site: Any, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    if "logged" not in plugin_site.names:
        plugin_site.add("logged", LOGGED)
    environment = {"CALLS_LOG": str(tmp_path / "calls.log"), **local_aws_env("http://unused"), **(env or {})}
    return servers.start("--async-queue", str(tmp_path / "queue"), *args, env=environment)


def _stem(accepted: dict[str, Any], output: str, failure: str) -> str:
    """The name the server gave a request's files (a new UUID), checked: ``<output><stem>.out`` and
    ``<failure><stem>-error.out``."""
    found = re.fullmatch(re.escape(output) + r"([0-9a-f-]{36})\.out", accepted["OutputLocation"])
    assert found is not None, accepted["OutputLocation"]
    assert accepted["FailureLocation"] == f"{failure}{found.group(1)}-error.out"
    return found.group(1)


def _answered(accepted: dict[str, Any], deadline: float = 30) -> bytes:
    """The answer at a local OutputLocation, once it is there."""
    path = Path(accepted["OutputLocation"])
    wait_until(path.exists, deadline, f"no answer at {path}")
    return path.read_bytes()


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _s3_object(s3: Any, location: str, deadline: float = 30) -> Any:
    """The S3 object at ``location`` (``s3://jobs/...``) once it exists."""
    key = location.removeprefix("s3://jobs/")

    def found() -> Any:
        try:
            return s3.get_object(Bucket="jobs", Key=key)
        except s3.exceptions.NoSuchKey:
            return None

    return wait_until(found, deadline, f"no object at {location}", poll=0.1)


def test_boto3_over_s3_answers_what_invocations_answers(
    servers: Any, plugin_site: Any, tmp_path: Path, s3: Any, listener: Listener
) -> None:
    """An input in S3 is answered at OutputLocation as /invocations answers it (its media type the object's); a
    failing model's error is at FailureLocation; an input that is not there is accepted, then failed; each is
    announced to the success or error listener in SageMaker's format, and counted in /metrics."""
    server = _serve(
        servers,
        plugin_site,
        tmp_path,
        "--async-output",
        "s3://jobs/out",
        "--async-failure",
        "s3://jobs/failures/",
        "--async-notify-success",
        f"{listener.url}/ok",
        "--async-notify-error",
        f"{listener.url}/error",
        env={**S3_CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3.endpoint},
    )
    s3.put_object(Bucket="jobs", Key="in/a.txt", Body=b"hello async")
    s3.put_object(Bucket="jobs", Key="in/boom.txt", Body=b"boom!")
    runtime = _runtime(server)

    accepted = runtime.invoke_endpoint_async(
        EndpointName="my-endpoint", InputLocation="s3://jobs/in/a.txt", ContentType="text/plain", InferenceId="one"
    )
    assert accepted["ResponseMetadata"]["HTTPStatusCode"] == 202
    assert accepted["InferenceId"] == "one"
    stem = _stem(accepted, "s3://jobs/out/", "s3://jobs/failures/")
    answer = _s3_object(s3, accepted["OutputLocation"])
    direct = server.request("POST", "/invocations", b"hello async", {"Content-Type": "text/plain"})
    assert answer["Body"].read() == direct.body == b"HELLO ASYNC"
    assert answer["ContentType"] == direct.headers["Content-Type"] == "text/plain"

    failing = runtime.invoke_endpoint_async(EndpointName="my-endpoint", InputLocation="s3://jobs/in/boom.txt")
    assert failing["InferenceId"]  # made up by the server
    error = json.loads(_s3_object(s3, failing["FailureLocation"])["Body"].read())
    assert error["status"] == 500
    assert "predict_fn raised ValueError" in error["message"]

    missing = runtime.invoke_endpoint_async(EndpointName="my-endpoint", InputLocation="s3://jobs/in/nothing.txt")
    assert missing["ResponseMetadata"]["HTTPStatusCode"] == 202  # the service reads the input later, too
    unread = json.loads(_s3_object(s3, missing["FailureLocation"])["Body"].read())
    assert "s3://jobs/in/nothing.txt" in unread["message"]

    wait_until(lambda: len(listener.received) == 3, 30, "three notifications did not arrive")
    by_id = {body["inferenceId"]: (path, body) for path, body in listener.received}
    path, success = by_id["one"]
    assert path == "/ok"
    assert success["invocationStatus"] == "Completed"
    assert success["eventName"] == "InferenceResult"
    assert success["eventSource"] == "aws:sagemaker"
    assert success["eventVersion"] == "1.0"
    assert success["requestParameters"] == {
        "contentType": "text/plain",
        "endpointName": "my-endpoint",
        "inputLocation": "s3://jobs/in/a.txt",
    }
    assert success["responseParameters"] == {"contentType": "text/plain", "outputLocation": f"s3://jobs/out/{stem}.out"}
    assert success["eventTime"].endswith("Z")
    assert success["receivedTime"] <= success["eventTime"]
    path, failed = by_id[failing["InferenceId"]]
    assert path == "/error"
    assert failed["invocationStatus"] == "Failed"
    assert failed["failureReason"].startswith("ClientError: Received server error (500) from model.")
    assert failed["failureLocation"] == failing["FailureLocation"]
    assert "responseParameters" not in failed
    assert by_id[missing["InferenceId"]][1]["invocationStatus"] == "Failed"

    assert server.metric("inference_server_async_requests_finished_total", outcome="done") == 1
    assert server.metric("inference_server_async_requests_finished_total", outcome="failed") == 2
    assert server.metric("inference_server_async_requests", state="queued") == 0
    assert server.metric("inference_server_requests_total", route="/invocations", status="200") == 2
    assert _calls(tmp_path) == ["hello async", "hello async"]  # the async request and the direct one
    assert '"inference_id":"one"' in server.output().replace(" ", "")  # its access line names it


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_local_directories_on_each_backend(servers: Any, plugin_site: Any, tmp_path: Path, backend: str) -> None:
    """With a local output directory, a local input path is read and the answer written as <uuid>.out; an inline body
    (botocore 1.44's Body) is answered too; the access line of the invocation names the inference id."""
    server = _serve(servers, plugin_site, tmp_path, "--server", backend, "--async-output", str(tmp_path / "out"))
    source = tmp_path / "input.txt"
    source.write_bytes(b"from a file")
    accepted = _runtime(server).invoke_endpoint_async(
        EndpointName="ep", InputLocation=str(source), InferenceId="local-1"
    )
    _stem(accepted, f"{tmp_path / 'out'}/", f"{tmp_path / 'out'}/")
    output = Path(accepted["OutputLocation"])
    wait_until(output.exists, 30, "no answer written")
    assert output.read_bytes() == b"FROM A FILE"
    inline = server.request(
        "POST",
        "/endpoints/ep/async-invocations",
        b"inline body",
        {"X-Amzn-SageMaker-Inference-Id": "inline-1", "X-Amzn-SageMaker-Content-Type": "text/plain"},
    )
    assert inline.status == 202, inline.body
    assert inline.json() == {"InferenceId": "inline-1"}
    written = Path(inline.headers["X-Amzn-SageMaker-OutputLocation"])
    wait_until(written.exists, 30, "no answer to the inline body")
    assert written.read_bytes() == b"INLINE BODY"
    wait_until(lambda: not list((tmp_path / "queue" / "inputs").iterdir()), 10, "the inline input was kept")
    assert not [path for path in (tmp_path / "out").iterdir() if path.name.endswith(".incomplete")]


def test_requests_the_service_refuses_are_refused(servers: Any, plugin_site: Any, tmp_path: Path, s3: Any) -> None:
    """What botocore sends without checking (maximums, patterns) is a 400 ValidationError as the service answers,
    saying what is wrong; a local input path is refused when answers go to S3; nothing is queued for them."""
    server = _serve(
        servers,
        plugin_site,
        tmp_path,
        "--async-output",
        "s3://jobs/out",
        env={**S3_CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3.endpoint},
    )
    runtime = _runtime(server)
    cases = [
        ({"RequestTTLSeconds": 21601}, "RequestTTLSeconds must be a whole number of seconds from 60 to 21600"),
        ({"InvocationTimeoutSeconds": 3601}, "InvocationTimeoutSeconds must be a whole number of seconds from 1"),
        ({"InferenceId": "x" * 65}, "InferenceId must be 1 to 64 printable ASCII characters"),
        ({"InputLocation": "/etc/hostname"}, "is a local path, but answers go to s3://jobs/out"),
        ({"InputLocation": "https://jobs.s3.amazonaws.com/a"}, "is an https URL"),
        ({"InputLocation": "s3:///no-bucket"}, "names no bucket"),
        ({"EndpointName": "not_valid"}, "is not one SageMaker allows"),
    ]
    for change, message in cases:
        arguments = {"EndpointName": "ep", "InputLocation": "s3://jobs/in/a.txt", **change}
        with pytest.raises(botocore.exceptions.ClientError) as raised:
            runtime.invoke_endpoint_async(**arguments)
        error = raised.value.response["Error"]
        assert error["Code"] == "ValidationError", change
        assert message in error["Message"], (change, error["Message"])
    neither = server.request("POST", "/endpoints/ep/async-invocations")
    assert neither.status == 400
    assert neither.headers["x-amzn-ErrorType"] == "ValidationError"
    assert "give InputLocation" in neither.json()["message"]
    both = server.request(
        "POST", "/endpoints/ep/async-invocations", b"x", {"X-Amzn-SageMaker-InputLocation": "s3://jobs/a"}
    )
    assert both.status == 400
    assert "mutually exclusive" in both.json()["message"]
    too_large = server.request("POST", "/endpoints/ep/async-invocations", b"x" * 128_001)
    assert too_large.status == 400
    assert too_large.headers["x-amzn-ErrorType"] == "ValidationError"
    assert "larger than 128000 bytes" in too_large.json()["message"]
    assert server.metric("inference_server_async_requests", state="queued") == 0


def test_off_unless_asked_for(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """Without --async-output the route answers 404 saying how to turn it on."""
    plugin_site.add("logged", LOGGED)
    server = servers.start()
    refused = server.request(
        "POST", "/endpoints/ep/async-invocations", headers={"X-Amzn-SageMaker-InputLocation": "s3://a/b"}
    )
    assert refused.status == 404
    assert "--async-output" in refused.json()["message"]


def test_a_full_queue_is_throttled(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """Past --async-max-queue requests queued or running, a new one is a 503 ThrottlingException, nothing queued (an
    inline body refused is not kept); once the queue drains the next is accepted."""
    server = _serve(
        servers,
        plugin_site,
        tmp_path,
        *("--async-output", str(tmp_path / "out"), "--async-max-queue", "2"),
        env={"SLEEP": "1"},
    )
    source = tmp_path / "input.txt"
    source.write_bytes(b"slow")
    runtime = _runtime(server)
    first = [runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(source)) for _ in range(2)]
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(source))
    assert raised.value.response["Error"]["Code"] == "ThrottlingException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "--async-max-queue" in raised.value.response["Error"]["Message"]
    inline = server.request("POST", "/endpoints/ep/async-invocations", b"inline")
    assert inline.status == 503
    assert list((tmp_path / "queue" / "inputs").iterdir()) == []
    assert [_answered(accepted) for accepted in first] == [b"SLOW", b"SLOW"]
    wait_until(lambda: server.metric("inference_server_async_requests", state="running") == 0, 10, "still running")
    last = runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(source))
    assert _answered(last) == b"SLOW"
    assert len(list((tmp_path / "out").iterdir())) == 3
    assert len(_calls(tmp_path)) == 3


def test_an_inference_id_sent_again_gets_new_locations(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """Two requests with the same InferenceId (a retry, a business key) get their own files, as SageMaker names them:
    the second's answer is never the first's."""
    server = _serve(servers, plugin_site, tmp_path, "--async-output", str(tmp_path / "out"))
    (tmp_path / "a.txt").write_bytes(b"first")
    (tmp_path / "b.txt").write_bytes(b"second")
    runtime = _runtime(server)
    one = runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(tmp_path / "a.txt"), InferenceId="k")
    two = runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(tmp_path / "b.txt"), InferenceId="k")
    assert one["InferenceId"] == two["InferenceId"] == "k"
    assert one["OutputLocation"] != two["OutputLocation"]
    assert (_answered(one), _answered(two)) == (b"FIRST", b"SECOND")


def test_filename_and_extension_name_the_files(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """Filename and S3OutputPathExtension (botocore 1.44's) name a request's files under the output; one that would
    leave it (..), or is not the service's form, is a 400 ValidationError."""
    server = _serve(servers, plugin_site, tmp_path, "--async-output", str(tmp_path / "out"))
    (tmp_path / "a.txt").write_bytes(b"named")
    headers = {"X-Amzn-SageMaker-InputLocation": str(tmp_path / "a.txt")}
    named = server.request(
        "POST",
        "/endpoints/ep/async-invocations",
        headers={
            **headers,
            "X-Amzn-SageMaker-Filename": "result.txt",
            "X-Amzn-SageMaker-S3OutputPathExtension": "day/one",
        },
    )
    assert named.status == 202, named.body
    assert named.headers["X-Amzn-SageMaker-OutputLocation"] == str(tmp_path / "out" / "day" / "one" / "result.txt.out")
    assert named.headers["X-Amzn-SageMaker-FailureLocation"] == str(
        tmp_path / "out" / "day" / "one" / "result.txt-error.out"
    )
    assert _answered({"OutputLocation": named.headers["X-Amzn-SageMaker-OutputLocation"]}) == b"NAMED"
    for header, value in (
        ("X-Amzn-SageMaker-S3OutputPathExtension", "../escape"),
        ("X-Amzn-SageMaker-S3OutputPathExtension", "a/../../escape"),
        ("X-Amzn-SageMaker-S3OutputPathExtension", "/absolute"),
        ("X-Amzn-SageMaker-Filename", "../escape"),
        ("X-Amzn-SageMaker-Filename", "a.b.c"),
        ("X-Amzn-SageMaker-RequestTTLSeconds", "+300"),
    ):
        refused = server.request("POST", "/endpoints/ep/async-invocations", headers={**headers, header: value})
        assert refused.status == 400, (header, value, refused.body)
        assert refused.headers["x-amzn-ErrorType"] == "ValidationError"
    assert not any(path.name == "escape" for path in tmp_path.rglob("*"))


def test_the_queue_survives_sigkill_of_every_process(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """Requests accepted, then every process of the server killed (SIGKILL) while one runs: after serve starts
    again on the same queue each request is answered, none is lost, and none that was finished is done again
    (only the one cut short runs twice)."""
    args = ("--async-output", str(tmp_path / "out"))
    first = _serve(servers, plugin_site, tmp_path, *args, env={"SLEEP": "0.5"})
    inputs = []
    for number in range(8):
        path = tmp_path / f"input-{number}.txt"
        path.write_text(f"item {number}")
        inputs.append(path)
    runtime = _runtime(first)
    accepted = [runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(path)) for path in inputs]
    wait_until(lambda: len(_calls(tmp_path)) >= 2, 30, "nothing ran")
    for pid in [*first.workers(), first.process.pid]:
        os.kill(pid, signal.SIGKILL)
    first.process.wait(10)
    finished = {str(path) for path in (tmp_path / "out").glob("*.out")}
    assert len(finished) < 8  # (the kill came while some waited)
    calls_before = _calls(tmp_path)

    second = _serve(servers, plugin_site, tmp_path, *args)
    wait_until(lambda: len(list((tmp_path / "out").glob("*.out"))) == 8, 60, "not every request was answered")
    for number in range(8):
        assert _answered(accepted[number]) == f"ITEM {number}".encode()
    calls = _calls(tmp_path)
    again = [
        call for call in calls[len(calls_before) :] if accepted[int(call.split()[1])]["OutputLocation"] in finished
    ]
    assert again == []  # nothing finished before the kill was done again
    assert sorted(set(calls)) == sorted(f"item {number}" for number in range(8))
    assert len(calls) <= 9  # at most the one cut short twice
    assert second.metric("inference_server_async_requests", state="queued") == 0


def test_an_entry_past_its_ttl_fails_as_expired(
    servers: Any, plugin_site: Any, tmp_path: Path, listener: Listener
) -> None:
    """A request still queued when its RequestTTLSeconds runs out (here: the server was stopped longer than that;
    the entry's expiry moved into the past as time would move it) is not run: its failure is written, announced,
    and counted as expired."""
    args = ("--async-output", str(tmp_path / "out"), "--async-notify-error", listener.url)
    (tmp_path / "busy.txt").write_bytes(b"busy")
    (tmp_path / "late.txt").write_bytes(b"late")
    first = _serve(servers, plugin_site, tmp_path, *args, "--async-workers", "1", env={"SLEEP": "2"})
    runtime = _runtime(first)
    busy = runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(tmp_path / "busy.txt"))
    accepted = runtime.invoke_endpoint_async(
        EndpointName="ep", InputLocation=str(tmp_path / "late.txt"), InferenceId="late", RequestTTLSeconds=60
    )
    first.stop(signal.SIGKILL)
    with contextlib.closing(sqlite3.connect(tmp_path / "queue" / "queue.sqlite3")) as db, db:
        db.execute("UPDATE entries SET expires = ? WHERE request LIKE '%\"late\"%'", (time.time() - 1,))
    second = _serve(servers, plugin_site, tmp_path, *args)
    failure = Path(accepted["FailureLocation"])
    wait_until(failure.exists, 30, "no failure written for the expired request")
    assert "past its RequestTTLSeconds of 60 s" in json.loads(failure.read_text())["message"]
    assert not Path(accepted["OutputLocation"]).exists()
    wait_until(lambda: listener.received, 10, "no error notification")
    assert listener.received[0][1]["inferenceId"] == "late"
    assert "RequestTTLSeconds" in listener.received[0][1]["failureReason"]
    assert _answered(busy) == b"BUSY"
    assert second.metric("inference_server_async_requests_finished_total", outcome="expired") == 1
    assert _calls(tmp_path) == ["busy"]


def test_invocation_timeout_is_the_requests_own(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """InvocationTimeoutSeconds replaces --timeout for an asynchronous request: one longer than --timeout is
    answered; one over its own timeout fails with the 504 at its failure location."""
    server = _serve(
        servers, plugin_site, tmp_path, "--async-output", str(tmp_path / "out"), "--timeout", "1", env={"SLEEP": "2"}
    )
    source = tmp_path / "input.txt"
    source.write_bytes(b"patience")
    runtime = _runtime(server)
    long = runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(source), InvocationTimeoutSeconds=30)
    short = runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(source), InvocationTimeoutSeconds=1)
    assert _answered(long) == b"PATIENCE"
    failure = Path(short["FailureLocation"])
    wait_until(failure.exists, 30, "the short request did not fail")
    error = json.loads(failure.read_text())
    assert error["status"] == 504
    assert "its timeout of 1 s" in error["message"]
    direct = server.request("POST", "/invocations", b"patience")
    assert direct.status == 504  # --timeout still bounds real-time requests


def test_notifications_to_sns_topics(servers: Any, plugin_site: Any, tmp_path: Path, s3: Any) -> None:
    """An SNS topic ARN given to --async-notify-success and --async-notify-error is published to with boto3 (a real
    local SNS, moto's): the message a subscribed queue receives is SageMaker's notification."""
    aws = {"region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    sns = boto3.client("sns", endpoint_url=s3.endpoint, **aws)
    sqs = boto3.client("sqs", endpoint_url=s3.endpoint, **aws)
    topic = sns.create_topic(Name="async-results")["TopicArn"]
    queue = sqs.create_queue(QueueName="results")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    server = _serve(
        servers,
        plugin_site,
        tmp_path,
        *("--async-output", str(tmp_path / "out")),
        *("--async-notify-success", topic, "--async-notify-error", topic),
        env={**S3_CREDENTIALS, "AWS_ENDPOINT_URL_SNS": s3.endpoint},
    )
    (tmp_path / "good.txt").write_bytes(b"fine")
    (tmp_path / "bad.txt").write_bytes(b"boom")
    runtime = _runtime(server)
    good = runtime.invoke_endpoint_async(
        EndpointName="ep", InputLocation=str(tmp_path / "good.txt"), InferenceId="good"
    )
    runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(tmp_path / "bad.txt"), InferenceId="bad")
    received: dict[str, Any] = {}

    def both() -> bool:
        for message in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", []):
            body = json.loads(message["Body"])
            received[body["inferenceId"]] = body
        return len(received) == 2

    wait_until(both, 30, "the notifications did not reach the queue", poll=0.2)
    assert received["good"]["invocationStatus"] == "Completed"
    assert received["good"]["responseParameters"]["outputLocation"] == good["OutputLocation"]
    assert received["bad"]["invocationStatus"] == "Failed"
    assert received["bad"]["eventSource"] == "aws:sagemaker"
    assert server.metric("inference_server_async_notification_failures_total") == 0


def test_a_notification_that_cannot_be_delivered_is_counted(
    servers: Any, plugin_site: Any, tmp_path: Path, unused_port: int
) -> None:
    """A notification whose listener is not there is logged and counted; the answer is written all the same."""
    server = _serve(
        servers,
        plugin_site,
        tmp_path,
        *("--async-output", str(tmp_path / "out")),
        *("--async-notify-success", f"http://127.0.0.1:{unused_port}/gone"),
    )
    (tmp_path / "input.txt").write_bytes(b"unheard")
    accepted = _runtime(server).invoke_endpoint_async(
        EndpointName="ep", InputLocation=str(tmp_path / "input.txt"), InferenceId="x"
    )
    assert _answered(accepted) == b"UNHEARD"
    wait_until(
        lambda: server.metric("inference_server_async_notification_failures_total") == 1, 30, "the failure uncounted"
    )
    assert f"Notifying http://127.0.0.1:{unused_port}/gone of asynchronous request x failed" in server.output()
    assert server.metric("inference_server_async_requests_finished_total", outcome="done") == 1


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_sigterm_lets_a_running_request_finish(servers: Any, plugin_site: Any, tmp_path: Path, backend: str) -> None:
    """SIGTERM while an asynchronous request runs: the drain waits for it (its answer written, its entry finished)
    and the requests still queued stay queued for the next start, none of them begun."""
    server = _serve(
        servers, plugin_site, tmp_path, "--server", backend, "--async-output", str(tmp_path / "out"), env={"SLEEP": "2"}
    )
    (tmp_path / "a.txt").write_bytes(b"running")
    runtime = _runtime(server)
    running = runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(tmp_path / "a.txt"))
    waiting = runtime.invoke_endpoint_async(EndpointName="ep", InputLocation=str(tmp_path / "a.txt"))
    wait_until(lambda: server.metric("inference_server_async_requests", state="running") == 1, 30, "nothing ran")
    assert server.stop(signal.SIGTERM, timeout=30) == 0
    assert Path(running["OutputLocation"]).read_bytes() == b"RUNNING"
    assert not Path(waiting["OutputLocation"]).exists()
    assert _calls(tmp_path) == ["running"]
    with contextlib.closing(sqlite3.connect(tmp_path / "queue" / "queue.sqlite3")) as db:
        assert db.execute("SELECT state, attempts FROM entries").fetchall() == [("queued", 0)]


def test_the_default_queue_is_the_servers_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without --async-queue the queue is under XDG_STATE_HOME in a directory named after the server's output,
    failure location, model directory and script: the same server finds it again, another never shares it."""
    from inference_server._async_inference import default_queue_directory
    from inference_server._settings import Settings

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    first = default_queue_directory(Settings.from_env({}, async_output="/srv/answers"))
    assert first == default_queue_directory(Settings.from_env({}, async_output="/srv/answers"))
    assert first.parent == tmp_path / "inference-server" / "async-queue"
    for other in (
        {"async_output": "/srv/other"},
        {"async_output": "/srv/answers", "async_failure": "/srv/failures"},
        {"async_output": "/srv/answers", "model_dir": "/srv/model-b"},
    ):
        assert default_queue_directory(Settings.from_env({}, **other)) != first


SLOW_STREAM = """
    import time

    import inference_server

    @inference_server.plugin_hook
    def input_fn(input_data, content_type):
        return bytes(input_data)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        for part in data.split(b","):
            time.sleep(0.6)
            yield part.upper()

    @inference_server.plugin_hook
    def output_fn(prediction, accept):
        return prediction, "text/plain"
"""


def test_a_stream_is_bounded_by_its_invocation_timeout(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """An asynchronous request's streamed answer is bounded by its InvocationTimeoutSeconds, not --stream-timeout:
    a stream longer than --stream-timeout is written whole (its chunks joined)."""
    plugin_site.add("slow_stream", SLOW_STREAM)
    server = servers.start(
        *("--async-output", str(tmp_path / "out"), "--async-queue", str(tmp_path / "queue")),
        *("--stream-timeout", "1"),
        plugins=["slow_stream"],
    )
    (tmp_path / "a.txt").write_bytes(b"a,b,c")
    accepted = _runtime(server).invoke_endpoint_async(
        EndpointName="ep", InputLocation=str(tmp_path / "a.txt"), InvocationTimeoutSeconds=30
    )
    assert _answered(accepted) == b"ABC"
    try:  # a real-time stream is still cut at --stream-timeout
        cut = server.request("POST", "/invocations", b"a,b,c").body
    except http.client.IncompleteRead as exc:
        cut = exc.partial
    assert cut != b"ABC", cut
