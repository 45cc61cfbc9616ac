"""A real server with the plugin streams the tokens as the model makes them: server-sent events read by a real SSE
client, JSON Lines by default, SageMaker's event stream read by boto3, and a client that goes away stops the model."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sseclient
import token_stream

#: The tokens the model makes for a request: the same as the server's, the model being deterministic.
MODEL = token_stream.BigramModel.from_text(token_stream.CORPUS)


def expected(request: dict[str, Any]) -> list[str]:
    """The tokens the server must send for ``request``."""
    return list(MODEL.generate(request.get("prompt", ""), request.get("max_tokens", 16), request.get("seed", 0)))


def chunks(response: http.client.HTTPResponse) -> Iterator[bytes]:
    """The body as it arrives."""
    while chunk := response.read1(65536):
        yield chunk


def test_server_sent_events_carry_one_token_each(serve: Callable[..., Any]) -> None:
    """Accept: text/event-stream gets a chunked stream of one event per token, read by sseclient-py: the first
    event, then the rest, are the model's tokens, and the model made every one."""
    server = serve()
    request = {"prompt": "I thought", "max_tokens": 40, "seed": 2, "delay_ms": 5}
    with server.generate(request, accept="text/event-stream") as response:
        assert response.status == 200
        assert response.getheader("Content-Type") == "text/event-stream"
        assert response.getheader("Transfer-Encoding") == "chunked"
        events = sseclient.SSEClient(chunks(response)).events()
        first = next(events).data
        rest = [event.data for event in events]
    assert [first, *rest] == expected(request)
    assert server.logged("Made ") == ["Made 40 of 40 tokens"]


def test_the_first_token_is_sent_before_the_last_is_made(serve: Callable[..., Any]) -> None:
    """A client that reads the first token and goes away stops the model: its generator is closed having made only
    some of the 500 tokens asked for (20 ms each), so the first was sent before the last was made, and the server
    goes on serving."""
    server = serve()
    request = {"prompt": "Call me", "max_tokens": 500, "delay_ms": 20}
    with server.generate(request) as response:
        assert json.loads(response.readline()) == expected(request)[0]
    [made] = server.logged("Made ")
    assert made.endswith(" of 500 tokens")
    assert 1 <= int(made.split()[1]) < 500
    with server.generate({"max_tokens": 3}) as response:
        assert len(response.read().splitlines()) == 3


def test_json_lines_are_the_default(serve: Callable[..., Any]) -> None:
    """Without an Accept header the tokens come as JSON Lines, one JSON string per line, chunked."""
    server = serve()
    request = {"prompt": "the watery part", "max_tokens": 25}
    with server.generate(request) as response:
        assert response.getheader("Content-Type") == "application/jsonlines"
        assert response.getheader("Transfer-Encoding") == "chunked"
        first = json.loads(response.readline())
        rest = [json.loads(line) for line in response.read().splitlines()]
    assert [first, *rest] == expected(request)


def test_boto3_reads_the_tokens_from_the_response_stream(
    serve: Callable[..., Any], runtime: Callable[..., Any]
) -> None:
    """boto3's invoke_endpoint_with_response_stream gets the tokens as PayloadParts of JSON Lines by default and of
        server-sent events when it accepts them; a bad request is refused before any token, as SageMaker refuses it: a
    ModelError carrying the model's 400 and its message."""
    server = serve()
    client = runtime(server)
    request = {"prompt": "I would sail", "max_tokens": 12, "seed": 5}
    response = client.invoke_endpoint_with_response_stream(
        EndpointName="token-stream", Body=json.dumps(request), ContentType="application/json"
    )
    assert response["ContentType"] == "application/jsonlines"
    lines = b"".join(event["PayloadPart"]["Bytes"] for event in response["Body"]).splitlines()
    assert [json.loads(line) for line in lines] == expected(request)

    response = client.invoke_endpoint_with_response_stream(
        EndpointName="token-stream",
        Body=json.dumps(request),
        ContentType="application/json",
        Accept="text/event-stream",
    )
    assert response["ContentType"] == "text/event-stream"
    parts = [event["PayloadPart"]["Bytes"] for event in response["Body"]]
    assert parts == [f"data: {token}\n\n".encode() for token in expected(request)]

    with pytest.raises(client.exceptions.ModelError) as refused:
        client.invoke_endpoint_with_response_stream(
            EndpointName="token-stream", Body=json.dumps({"max_tokens": 0}), ContentType="application/json"
        )
    assert refused.value.response["OriginalStatusCode"] == 400
    assert "max_tokens must be a whole number" in refused.value.response["OriginalMessage"]
