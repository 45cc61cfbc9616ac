"""Client download speed: our Predictor against requests and boto3 for a 100 MB ``.npy`` answer, in one run.

The server (gunicorn backend, the faster writer) returns a prepared 100 MB float32 array for any request; each
client sends a tiny body and decodes the answer to an ndarray: our Predictor, requests + np.load, boto3 with our
NumpyDeserializer and boto3 with the SageMaker SDK's. Alternating, medians of GB/s.
Run: ``.venv/bin/python benchmarks/client.py``.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from collections.abc import Callable

import _harness as h
import _results
import boto3
import numpy as np
import requests

from inference_server.client import NumpyDeserializer, NumpySerializer, Predictor

BIG = """
    import numpy as np
    import inference_server

    ANSWER = np.ones(25_000_000, dtype=np.float32)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return ANSWER
"""
PAYLOAD = 100_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _results.add_argument(parser)
    args = parser.parse_args()
    run = _results.Run("client")
    site = h.plugin_site({"big_answer": BIG})
    env = h.base_env(PYTHONPATH=str(site), INFERENCE_SERVER_PLUGINS="big_answer", INFERENCE_SERVER_LOG_LEVEL="warning")
    port = h.free_port()
    command = f"{h.PYTHON} -m inference_server serve --host 127.0.0.1 --port {port} --workers 1 --server gunicorn"
    url = f"http://127.0.0.1:{port}"
    body = NumpySerializer().serialize(np.zeros(1))
    with h.running("server", command.split(), port, env):
        predictor = Predictor(url, NumpySerializer(), NumpyDeserializer())
        session = requests.Session()
        headers = {"Content-Type": "application/x-npy", "Accept": "application/x-npy"}
        for name, value in {
            "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            os.environ[name] = value
        runtime = boto3.client("sagemaker-runtime")

        def with_requests() -> np.ndarray:
            response = session.post(f"{url}/invocations", data=body, headers=headers)
            return np.load(io.BytesIO(response.content))

        def with_boto3() -> np.ndarray:
            response = runtime.invoke_endpoint(EndpointName="e", Body=body, ContentType="application/x-npy")
            return NumpyDeserializer().deserialize(response["Body"], response["ContentType"])  # type: ignore[no-any-return]

        def with_sdk() -> np.ndarray:
            response = runtime.invoke_endpoint(EndpointName="e", Body=body, ContentType="application/x-npy")
            return sdk_deserializer.deserialize(response["Body"], response["ContentType"])  # type: ignore[no-any-return]

        os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
        import sagemaker.deserializers

        sdk_deserializer = sagemaker.deserializers.NumpyDeserializer()

        clients: dict[str, Callable[[], np.ndarray]] = {
            "ours Predictor": lambda: predictor.predict(np.zeros(1)),
            "requests + np.load": with_requests,
            "boto3 invoke_endpoint": with_boto3,
            "boto3 + the SDK's deser.": with_sdk,
        }
        samples: dict[str, list[float]] = {name: [] for name in clients}
        for i in range(9):
            for name in list(clients)[i % len(clients) :] + list(clients)[: i % len(clients)]:
                started = time.perf_counter()
                array = clients[name]()
                samples[name].append(PAYLOAD / (time.perf_counter() - started) / 1e9)
                assert array.nbytes == PAYLOAD
        predictor.close()
    print(f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}: 100 MB .npy answer, median GB/s (request to ndarray)")
    ours = statistics.median(samples["ours Predictor"])
    for name, values in samples.items():
        value = statistics.median(values)
        print(f"  {name:<24} {value:6.2f} GB/s   ours / it {ours / value:5.2f}x")
    medians = {name: statistics.median(values) for name, values in samples.items()}
    run.group("100 MB .npy answer, request to ndarray", "GB/s", "higher", medians, ["ours Predictor"])
    for name in list(medians)[1:]:
        run.compare("100 MB .npy answer, request to ndarray", "ours Predictor", name)
    run.write(
        args.results, "Client download (client.py)", "gunicorn backend, one worker; 9 alternating rounds, medians"
    )


if __name__ == "__main__":
    main()
