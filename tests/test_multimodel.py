"""Multi-model endpoints on real servers with two workers: SageMaker's /models API, loads seen by every worker,
unloads that give memory back, 409/404/507, pagination, --model-root with TargetModel (directories and tarballs,
through boto3), least-recently-used eviction, and the metrics' bounded model label."""

from __future__ import annotations

import io
import os
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import local_aws_env, wait_until

MODEL = """
    import os

    import numpy as np

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        size = int(open(os.path.join(model_dir, "size_mb")).read())
        weights = np.ones(size << 17)  # size MB of float64, every page touched
        return {"name": os.path.basename(model_dir.rstrip("/")), "dir": model_dir, "weights": weights}

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {"model": model["name"], "pid": os.getpid(), "input": data}

    @inference_server.plugin_hook
    def model_unload_fn(model):
        open(os.path.join(model["dir"], f"unloaded-{os.getpid()}"), "w").close()
"""

JSON = {"Content-Type": "application/json"}
MB = 1 << 20


def model_dir(root: Path, name: str, size_mb: int = 1) -> Path:
    """A model directory whose model_fn allocates ``size_mb`` MB."""
    path = root / name
    path.mkdir(parents=True)
    (path / "size_mb").write_text(str(size_mb))
    return path


def load(server: Any, name: str, url: Path | str) -> Any:
    return server.request("POST", "/models", orjson.dumps({"model_name": name, "url": str(url)}), JSON)


def invoke(server: Any, name: str) -> Any:
    return server.request("POST", f"/models/{name}/invoke", b"[1, 2]", JSON)


def rss(pid: int) -> int:
    """Resident memory of process ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def server(servers: Any, plugin_site: Any, tmp_path: Path) -> Any:
    """A multi-model server with two workers, its model allocating what its directory says, loading models from the
    test's directory."""
    plugin_site.add("mm_model", MODEL)
    return servers.start("--multi-model", "--workers", "2", "--allow-model-dir", str(tmp_path), plugins=["mm_model"])


def test_ping_answers_with_no_model_loaded_and_the_api_answers_as_sagemaker_says(server: Any, tmp_path: Path) -> None:
    """/ping is 200 before any load; a load is 200, a second load of the name 409, a missing directory 404, a bad
    body 400; GET /models/{name} shows the entry and what it cost; an unknown name is 404 everywhere."""
    assert server.request("GET", "/ping").status == 200
    assert server.request("GET", "/models").json() == {"models": []}
    a = model_dir(tmp_path, "a")
    assert load(server, "a", a).status == 200
    conflict = load(server, "a", a)
    assert conflict.status == 409
    assert "loaded already" in conflict.json()["message"]
    assert load(server, "b", tmp_path / "missing").status == 404
    for body in (b"{not json", b"[]", b'{"model_name": "c"}', b'{"model_name": 3, "url": "/x"}'):
        reply = server.request("POST", "/models", body, JSON)
        assert reply.status == 400, body
    entry = server.request("GET", "/models/a").json()
    assert (entry["modelName"], entry["modelUrl"]) == ("a", str(a))
    private = entry["privateBytesByWorker"]
    assert private
    assert all(cost > 0 for cost in private.values())
    assert entry["memoryBytes"] == sum(private.values())
    assert entry["mappedBytes"] == 0
    for method, path in (("GET", "/models/zz"), ("DELETE", "/models/zz"), ("POST", "/models/zz/invoke")):
        assert server.request(method, path, b"[1]" if method == "POST" else None, JSON).status == 404


def test_a_model_loaded_through_one_worker_is_served_by_every_worker_and_never_404(server: Any, tmp_path: Path) -> None:
    """After a load, 200 invocations from 8 threads over new connections (spread over both workers) all succeed,
    and both workers answer."""
    for name in ("a", "b"):
        assert load(server, name, model_dir(tmp_path, name)).status == 200
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: invoke(server, "ab"[i % 2]), range(200)))
    assert [reply.status for reply in replies] == [200] * 200
    assert {reply.json()["model"] for reply in replies} == {"a", "b"}
    assert len({reply.json()["pid"] for reply in replies}) == 2


def test_listing_pages_through_every_model_by_name(server: Any, tmp_path: Path) -> None:
    """GET /models with page_size pages through all models in name order with nextPageToken; a bad token or size
    is 400."""
    names = [f"model-{i:02d}" for i in range(7)]
    for name in names:
        assert load(server, name, model_dir(tmp_path, name)).status == 200
    seen, token, pages = [], None, 0
    while True:
        query = "page_size=3" + (f"&next_page_token={token}" if token else "")
        page = server.request("GET", f"/models?{query}").json()
        seen += [model["modelName"] for model in page["models"]]
        pages += 1
        token = page.get("nextPageToken")
        if token is None:
            break
    assert (seen, pages) == (names, 3)
    assert server.request("GET", "/models?page_size=0").status == 400
    assert server.request("GET", "/models?next_page_token=%25%25").status == 400


def test_unloading_releases_the_model_in_every_worker_and_gives_the_memory_back(server: Any, tmp_path: Path) -> None:
    """Three 64 MB models, used by both workers, then unloaded: model_unload_fn runs in each worker, the names are
    404, and each worker's resident memory comes back within 10% of the empty server's (measured once a small
    model was loaded, used by both workers and unloaded: what serving itself takes)."""
    workers = sorted(server.workers())
    assert load(server, "warm-up", model_dir(tmp_path, "warm-up")).status == 200
    with ThreadPoolExecutor(4) as pool:
        assert {reply.status for reply in pool.map(lambda i: invoke(server, "warm-up"), range(40))} == {200}
    assert server.request("DELETE", "/models/warm-up").status == 200
    wait_until(
        lambda: len(list((tmp_path / "warm-up").glob("unloaded-*"))) == len(workers),
        10,
        "the warm-up model was not unloaded in every worker",
    )
    baseline = {pid: rss(pid) for pid in workers}
    names = ["a", "b", "c"]
    for name in names:
        assert load(server, name, model_dir(tmp_path, name, 64)).status == 200
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda i: invoke(server, names[i % 3]), range(60)))
    assert {reply.json()["pid"] for reply in replies} == set(workers)
    loaded = {pid: rss(pid) for pid in workers}
    assert all(loaded[pid] - baseline[pid] > 150 << 20 for pid in workers), (baseline, loaded)
    for name in names:
        assert server.request("DELETE", f"/models/{name}").status == 200
        assert invoke(server, name).status == 404
    deadline = time.monotonic() + 10
    while any(rss(pid) > baseline[pid] * 1.1 for pid in workers):
        assert time.monotonic() < deadline, ({pid: rss(pid) for pid in workers}, baseline)
        time.sleep(0.1)
    for name in names:
        assert {path.name for path in (tmp_path / name).glob("unloaded-*")} == {f"unloaded-{pid}" for pid in workers}


def test_past_max_models_or_the_memory_budget_a_load_is_507(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """--max-models 2: the third load is 507 until one is unloaded; --max-model-memory 100: a 64 MB model loads, a
    second does not (507), and the worker keeps serving the first."""
    plugin_site.add("mm_model", MODEL)
    allowed = ("--allow-model-dir", str(tmp_path))
    counted = servers.start("--multi-model", "--workers", "2", "--max-models", "2", *allowed, plugins=["mm_model"])
    for name in ("a", "b"):
        assert load(counted, name, model_dir(tmp_path / "counted", name)).status == 200
    full = load(counted, "c", model_dir(tmp_path / "counted", "c"))
    assert full.status == 507
    assert "--max-models" in full.json()["message"]
    assert counted.request("DELETE", "/models/a").status == 200
    assert load(counted, "c", tmp_path / "counted" / "c").status == 200
    budget = servers.start(
        "--multi-model", "--workers", "1", "--max-model-memory", "100", *allowed, plugins=["mm_model"]
    )
    assert load(budget, "big", model_dir(tmp_path / "budget", "big", 64)).status == 200
    over = load(budget, "bigger", model_dir(tmp_path / "budget", "bigger", 64))
    assert over.status == 507
    assert "--max-model-memory" in over.json()["message"]
    assert invoke(budget, "big").status == 200
    assert invoke(budget, "bigger").status == 404


FILE_MODEL = """
    import os

    import numpy as np

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        path = os.path.join(model_dir, "w.npy")
        mapped = os.path.exists(os.path.join(model_dir, "mapped"))
        weights = inference_server.mapped(path) if mapped else np.load(path)
        return {"weights": weights, "sum": float(weights.sum())}  # (every page read: resident)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {"pid": os.getpid(), "sum": model["sum"]}
"""


def file_model(root: Path, name: str, size_mb: int, mapped: bool) -> Path:
    """A model directory holding ``w.npy`` (``size_mb`` MB) that FILE_MODEL maps (``mapped``) or reads into memory."""
    path = root / name
    path.mkdir(parents=True)
    np.save(path / "w.npy", np.ones(size_mb << 17))
    if mapped:
        (path / "mapped").touch()
    return path


def test_the_memory_budget_counts_what_the_models_cost_the_machine(
    servers: Any, plugin_site: Any, tmp_path: Path
) -> None:
    """Two workers, --max-model-memory 100: three 30 MB mapped models load and, held by both workers, cost the machine
    30 MB each (GET /models and /metrics: their files once); a 30 MB model read into memory counts twice (every
    worker loads it), so it is 507 while two mapped ones are loaded (60 + 60), and loads once one is left."""
    plugin_site.add("mm_files", FILE_MODEL)
    server = servers.start(
        "--multi-model", "--workers", "2", "--max-model-memory", "100", "--allow-model-dir", str(tmp_path),
        plugins=["mm_files"],
    )  # fmt: skip
    for name in ("m1", "m2", "m3"):
        assert load(server, name, file_model(tmp_path, name, 30, mapped=True)).status == 200, name
    deadline = time.monotonic() + 30
    while len(server.request("GET", "/models/m1").json()["privateBytesByWorker"]) < 2:  # both workers hold m1
        assert time.monotonic() < deadline
        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(lambda _: invoke(server, "m1").status, range(8))) == {200}
    entry = server.request("GET", "/models/m1").json()
    size = (tmp_path / "m1" / "w.npy").stat().st_size
    assert size <= entry["mappedBytes"] < size + 8192
    assert entry["memoryBytes"] == entry["mappedBytes"] + sum(entry["privateBytesByWorker"].values())
    assert entry["memoryBytes"] < size + 8 * MB  # once, not once per worker
    over = load(server, "p", file_model(tmp_path, "p", 30, mapped=False))
    assert over.status == 507
    assert "--max-model-memory" in over.json()["message"]
    assert server.request("GET", "/models/p").status == 404
    assert server.request("DELETE", "/models/m1").status == 200
    assert load(server, "p", tmp_path / "p").status == 507  # 60 MB of files, and 30 MB in each of 2 workers
    assert server.request("DELETE", "/models/m2").status == 200
    assert load(server, "p", tmp_path / "p").status == 200
    scraped = {
        tuple(sample.labels.values()): sample.value
        for family in text_string_to_metric_families(server.request("GET", "/metrics").body.decode())
        for sample in family.samples
        if sample.name == "inference_server_model_memory_bytes"
    }
    assert size <= scraped[("mapped",)] < size + 8192  # m3's file, once
    assert scraped[("private",)] >= size  # p, in the worker that loaded it
    assert invoke(server, "p").status == 200


def test_a_worker_holding_no_target_model_asks_the_others_to_make_room(
    servers: Any, plugin_site: Any, tmp_path: Path
) -> None:
    """Two workers, --model-root, --max-model-memory 100: one worker holds three 30 MB TargetModels; the other,
    invoked for a fourth, has none of its own to unload, so it asks, and the first unloads its least recently used
    (t1) and no other: the invocation is 200 and the machine is within the budget (/metrics)."""
    plugin_site.add("mm_model", MODEL)
    root = tmp_path / "root"
    for name in ("t1", "t2", "t3", "t4"):
        model_dir(root, name, 30)
    model_dir(tmp_path, "probe", 0)
    server = servers.start(
        "--multi-model", "--workers", "2", "--model-root", str(root), "--max-model-memory", "100",
        "--allow-model-dir", str(tmp_path), plugins=["mm_model"],
    )  # fmt: skip
    assert load(server, "probe", tmp_path / "probe").status == 200

    def ask(connection: Any, method: str, path: str, headers: dict[str, str] | None = None) -> Any:
        connection.request(method, path, b"[1]", {**JSON, **(headers or {})})
        reply = connection.getresponse()
        return reply.status, orjson.loads(reply.read())

    first = server.connection()
    holder = ask(first, "POST", "/models/probe/invoke")[1]["pid"]
    for name in ("t1", "t2", "t3"):  # (a kept-alive connection: all in one worker)
        assert ask(first, "POST", "/invocations", {"X-Amzn-SageMaker-Target-Model": name}) == (
            200, {"model": name, "pid": holder, "input": [1]}
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:  # a kept-alive connection to the other worker
        other = server.connection()
        if ask(other, "POST", "/models/probe/invoke")[1]["pid"] != holder:
            break
        other.close()
        assert time.monotonic() < deadline, "no connection reached the second worker"
    status, answer = ask(other, "POST", "/invocations", {"X-Amzn-SageMaker-Target-Model": "t4"})
    assert (status, answer["model"]) == (200, "t4")
    assert answer["pid"] != holder
    assert [path.name for path in (root / "t1").glob("unloaded-*")] == [f"unloaded-{holder}"]
    assert not list((root / "t2").glob("unloaded-*"))
    assert f"asking worker {holder} to unload a model to make room for 't4'" in server.output()
    memory = [
        sample.value
        for family in text_string_to_metric_families(server.request("GET", "/metrics").body.decode())
        for sample in family.samples
        if sample.name == "inference_server_model_memory_bytes"
    ]
    assert 90 * MB <= sum(memory) <= 100 * MB  # t2, t3, t4 (and the tiny probe)
    first.close()
    other.close()


def test_a_model_loaded_through_the_api_counts_in_every_worker_even_with_no_worker_holding_it(tmp_path: Path) -> None:
    """--workers 2: a model whose load made 16 MB resident counts 32 MB for the machine's budget (every worker will
    load it), and still does once the worker that held it is gone: its registry entry keeps what the load cost."""
    from inference_server import _plugins, plugin_hook
    from inference_server._multimodel import MultiModel
    from inference_server._registry import Registry
    from inference_server._settings import Settings
    from inference_server.wsgi._app import App

    class Plugin:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            return np.ones(16 * MB // 8)

    settings = Settings(model_dir=str(tmp_path), multi_model=True, allow_model_dir=(str(tmp_path),), workers=2)
    app = App(settings, _plugins.build_manager([], [Plugin()]))
    models = MultiModel(app.pipeline, app.settings, Registry(tmp_path / "registry"))
    (tmp_path / "m").mkdir()
    models.load("m", str(tmp_path / "m"))
    assert 30 * MB < models.machine_bytes() < 36 * MB
    assert models.account()[0] == 1
    models.registry.forget_worker(os.getpid())  # (as the serving process does when the worker that held it exits)
    assert models.account() == (0, 0, 0)
    assert 30 * MB < models.machine_bytes() < 36 * MB


def test_the_watcher_leaves_alone_a_model_this_worker_is_registering(tmp_path: Path) -> None:
    """A worker's watcher that syncs while ``POST /models`` registers a model the worker has just loaded (loaded,
    counted, not yet in the registry) leaves it loaded and counted: the load registers what it cost (16 MB, 32 for
    two workers), not 0, and the machine's budget sees it (a watcher that dropped it let a second load past the
    budget)."""
    from inference_server import _plugins, plugin_hook
    from inference_server._multimodel import MultiModel
    from inference_server._registry import Registry
    from inference_server._settings import Settings
    from inference_server.wsgi._app import App

    class Plugin:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            return np.ones(16 * MB // 8)

    class Watched(Registry):
        """The registry, the worker's watcher syncing just before each registration (the registry changed)."""

        def add(self, name: str, url: str, private: int = 0) -> None:
            models.sync()
            super().add(name, url, private)

        def version(self) -> int:
            return time.monotonic_ns()

    settings = Settings(model_dir=str(tmp_path), multi_model=True, allow_model_dir=(str(tmp_path),), workers=2)
    app = App(settings, _plugins.build_manager([], [Plugin()]))
    models = MultiModel(app.pipeline, app.settings, Watched(tmp_path / "registry"))
    (tmp_path / "m").mkdir()
    models.load("m", str(tmp_path / "m"))
    found = models.registry.get("m")
    assert found is not None
    assert found.private > 15 * MB
    assert models.account()[0] == 1
    assert 30 * MB < models.machine_bytes() < 36 * MB
    assert models.at_hand("m") is not None  # loaded here still


def test_a_model_past_the_whole_budget_is_refused_without_unloading_others(
    servers: Any, plugin_site: Any, tmp_path: Path
) -> None:
    """--model-root, --max-model-memory 50: with t1 and t2 (20 MB each) held, a TargetModel of 64 MB is 507 at once
    and t1 and t2 stay loaded (no eviction for a model that could never fit)."""
    plugin_site.add("mm_model", MODEL)
    root = tmp_path / "root"
    for name, size in (("t1", 20), ("t2", 20), ("huge", 64)):
        model_dir(root, name, size)
    server = servers.start(
        "--multi-model", "--workers", "1", "--model-root", str(root), "--max-model-memory", "50", plugins=["mm_model"]
    )

    def target(name: str) -> Any:
        return server.request("POST", "/invocations", b"[1]", {**JSON, "X-Amzn-SageMaker-Target-Model": name})

    assert [target(name).status for name in ("t1", "t2")] == [200, 200]
    huge = target("huge")
    assert huge.status == 507
    assert "more than the 50 MB the models may cost the machine" in huge.json()["message"]
    assert not list((root / "t1").glob("unloaded-*"))
    assert not list((root / "t2").glob("unloaded-*"))


def _tarball(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def test_boto3_target_model_is_served_from_the_model_root_lazily_and_least_recently_used_is_evicted(
    servers: Any, plugin_site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """boto3's invoke_endpoint(TargetModel=...) reaches DIR/<target>, a directory or a .tar.gz unpacked safely;
    with --max-models 2 a third model unloads the least recently used; a tarball holding ../ or a link out is
    refused (ModelError) and writes nothing outside; a target outside the root is refused."""
    plugin_site.add("mm_model", MODEL)
    root = tmp_path / "root"
    model_dir(root, "plain")
    model_dir(root, "third")
    _tarball(root / "packed.tar.gz", {"size_mb": b"1"})
    _tarball(root / "escape.tar.gz", {"size_mb": b"1", "../escaped": b"x"})
    _tarball(root / "link.tar.gz", {"size_mb": b"1"}, {"out": "/etc/passwd"})
    server = servers.start("--model-root", str(root), "--max-models", "2", "--workers", "1", plugins=["mm_model"])
    for name, value in local_aws_env(f"http://127.0.0.1:{server.port}").items():
        monkeypatch.setenv(name, value)
    runtime = boto3.client("sagemaker-runtime")

    def call(target: str) -> Any:
        answer = runtime.invoke_endpoint(
            EndpointName="mme", TargetModel=target, Body=b"[1]", ContentType="application/json"
        )
        return orjson.loads(answer["Body"].read())

    assert call("plain")["model"] == "plain"
    assert call("packed.tar.gz")["input"] == [1]
    assert call("plain")["model"] == "plain"  # plain is now the most recently used
    assert call("third")["model"] == "third"  # over --max-models 2: packed.tar.gz, the least recent, goes
    assert not (root / "plain" / f"unloaded-{min(server.workers())}").exists()
    assert server.output().count("unloading 'packed.tar.gz', the least recently used") == 1
    for hostile in ("escape.tar.gz", "link.tar.gz", "../root/plain", "/etc"):
        with pytest.raises(botocore.exceptions.ClientError) as raised:
            call(hostile)
        assert raised.value.response["Error"]["Code"] in ("ModelError", "ValidationError"), hostile
    assert not (tmp_path / "escaped").exists()
    assert call("plain")["model"] == "plain"  # still serving


def test_a_target_model_without_a_model_root_is_a_clear_400(servers: Any) -> None:
    """A single-model server asked for a TargetModel answers 400 saying how to serve one."""
    server = servers.start(plugins=[])
    reply = server.request(
        "POST", "/endpoints/x/invocations", b"[1]", {**JSON, "X-Amzn-SageMaker-Target-Model": "a.tar.gz"}
    )
    assert reply.status == 400
    assert "--model-root" in reply.json()["message"]


#: Each model multiplies its rows by its directory's factor; each predict_fn call is logged as "name rows".
SCALED = """
    import os
    import time

    import numpy as np

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        name = os.path.basename(model_dir.rstrip("/"))
        return {"name": name, "factor": float(open(os.path.join(model_dir, "factor")).read())}

    @inference_server.plugin_hook
    def predict_fn(data, model):
        with open(os.environ["CALLS_LOG"], "a") as log:
            log.write(f"{model['name']} {len(data)}\\n")
        time.sleep(0.05)
        return np.asarray(data) * model["factor"]
"""


def test_invocations_of_a_multi_model_endpoint_are_micro_batched_per_model(
    servers: Any, plugin_site: Any, tmp_path: Path
) -> None:
    """--max-batch-size 8 on a multi-model endpoint: 24 concurrent invocations of two models through
    /models/{name}/invoke and TargetModel share predict_fn calls with requests of the same model only (fewer calls
    than requests, each call of one model), and each answer is its own rows times its own model's factor."""
    plugin_site.add("scaled", SCALED)
    calls = tmp_path / "calls.log"
    root = tmp_path / "root"
    for name, factor in (("a", 2), ("b", 3)):
        (root / name).mkdir(parents=True)
        (root / name / "factor").write_text(str(factor))
    server = servers.start(
        *("--multi-model", "--workers", "1", "--max-batch-size", "8", "--model-root", str(root)),
        plugins=["scaled"],
        env={"CALLS_LOG": str(calls)},
    )
    assert load(server, "a", root / "a").status == 200

    def send(i: int) -> None:
        row = [[float(i), float(i) + 0.5]]
        if i % 2:
            reply = server.request("POST", "/models/a/invoke", orjson.dumps(row), JSON)
            factor = 2
        else:
            headers = {**JSON, "X-Amzn-SageMaker-Target-Model": "b"}
            reply = server.request("POST", "/invocations", orjson.dumps(row), headers)
            factor = 3
        assert reply.status == 200, reply.body
        assert reply.json() == [[i * factor, (i + 0.5) * factor]]

    with ThreadPoolExecutor(24) as pool:
        list(pool.map(send, range(24)))
    logged = [line.split() for line in calls.read_text().splitlines()]
    assert sum(int(rows) for name, rows in logged if name == "a") == 12
    assert sum(int(rows) for name, rows in logged if name == "b") == 12
    assert len(logged) < 24, logged  # groups formed


def test_requests_for_models_that_are_not_loaded_get_no_model_label(
    servers: Any, plugin_site: Any, tmp_path: Path
) -> None:
    """100 invocations of names no worker holds (404s and 403s, as any client can send): none becomes a model label
    of the metrics, so they cannot push the real models into "other" (--metrics-max-models 2); the real one is
    counted under its name."""
    plugin_site.add("mm_model", MODEL)
    server = servers.start(
        *("--multi-model", "--workers", "1", "--metrics-max-models", "2", "--model-root", str(tmp_path)),
        plugins=["mm_model"],
    )
    model_dir(tmp_path, "real")
    for index in range(50):
        assert invoke(server, f"absent-{index}").status == 404
        target = {**JSON, "X-Amzn-SageMaker-Target-Model": f"../bogus-{index}"}
        assert server.request("POST", "/invocations", b"[1, 2]", target).status == 403
    assert (
        server.request("POST", "/invocations", b"[1, 2]", {**JSON, "X-Amzn-SageMaker-Target-Model": "real"}).status
        == 200
    )
    wait_until(
        lambda: server.metric("inference_server_requests_total", route="/invocations") >= 51, 10, "not counted yet"
    )
    labels = set()
    for family in text_string_to_metric_families(server.request("GET", "/metrics").body.decode()):
        for sample in family.samples:
            if sample.name == "inference_server_model_requests_total":
                labels.add(sample.labels["model"])
    assert labels == {"real"}


def test_the_model_label_of_the_metrics_is_bounded(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """--metrics-max-models 2: invocations of three models are counted under two names and other."""
    plugin_site.add("mm_model", MODEL)
    server = servers.start(
        *("--multi-model", "--workers", "1", "--metrics-max-models", "2", "--allow-model-dir", str(tmp_path)),
        plugins=["mm_model"],
    )
    for name in ("a", "b", "c"):
        assert load(server, name, model_dir(tmp_path, name)).status == 200
        assert invoke(server, name).status == 200
    wait_until(
        lambda: server.metric("inference_server_model_requests_total") >= 3, 10, "the invocations were not counted"
    )
    labels = set()
    for family in text_string_to_metric_families(server.request("GET", "/metrics").body.decode()):
        for sample in family.samples:
            if sample.name == "inference_server_model_requests_total":
                labels.add(sample.labels["model"])
    assert labels == {"a", "b", "other"}
    assert os.environ.get("SAGEMAKER_MULTI_MODEL") is None


def test_the_access_line_names_the_model_and_the_target_model_header(server: Any, tmp_path: Path) -> None:
    """An invocation's JSON access line carries the model's name and SageMaker's original TargetModel header."""
    assert load(server, "a", model_dir(tmp_path, "a")).status == 200
    headers = {**JSON, "X-Amzn-SageMaker-Target-Model": "team/a.tar.gz", "X-Request-Id": "mme-1"}
    assert server.request("POST", "/models/a/invoke", b"[1]", headers).status == 200
    deadline = time.monotonic() + 5
    while True:
        lines = [orjson.loads(line) for line in server.output().splitlines() if line.startswith("{")]
        found = [line for line in lines if line.get("request_id") == "mme-1" and line["logger"].endswith("access")]
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (found[0]["model"], found[0]["target_model"], found[0]["route"]) == (
        "a",
        "team/a.tar.gz",
        "/models/{name}/invoke",
    )


def test_a_model_unloaded_through_another_worker_is_never_served_while_this_one_drops_it(tmp_path: Path) -> None:
    """A worker's watcher that has seen an unload through another worker but not yet dropped the model: a request
    for it here is already a 404 (before: served from the model about to be dropped)."""
    from inference_server import _plugins, plugin_hook
    from inference_server._multimodel import MultiModel
    from inference_server._registry import Registry
    from inference_server._settings import Settings
    from inference_server.errors import NotFound
    from inference_server.wsgi._app import App

    class Plugin:
        @plugin_hook
        def model_fn(self, model_dir: str) -> str:
            return model_dir

    reading, release = threading.Event(), threading.Event()

    class Paused(Registry):
        """The registry, its listing held in the watcher's thread until released."""

        def all(self) -> Any:
            if threading.current_thread().name == "sync":
                reading.set()
                assert release.wait(10)
            return super().all()

    settings = Settings(model_dir=str(tmp_path), multi_model=True, allow_model_dir=(str(tmp_path),))
    app = App(settings, _plugins.build_manager([], [Plugin()]))
    here = MultiModel(app.pipeline, app.settings, Paused(tmp_path / "registry"))
    there = MultiModel(app.pipeline, app.settings, Registry(tmp_path / "registry"))
    (tmp_path / "m").mkdir()
    there.load("m", str(tmp_path / "m"))
    assert here.model("m") == str(tmp_path / "m")
    here.sync()
    there.unload("m")
    watcher = threading.Thread(target=here.sync, name="sync")
    watcher.start()
    try:
        assert reading.wait(10)
        with pytest.raises(NotFound):
            here.model("m")
    finally:
        release.set()
        watcher.join(10)
    with pytest.raises(NotFound):
        here.model("m")


def test_a_target_found_loaded_on_the_loop_is_kept(tmp_path: Path) -> None:
    """A model's target whose model the event loop finds loaded (``at_hand``, no thread) is kept as one found by
    ``model()`` on a thread is: the next invocation gets the same target; a name of no model is never kept."""
    from inference_server import _plugins, plugin_hook
    from inference_server._settings import Settings
    from inference_server.wsgi._app import App

    class Plugin:
        @plugin_hook
        def model_fn(self, model_dir: str) -> str:
            return model_dir

    settings = Settings(model_dir=str(tmp_path), multi_model=True, allow_model_dir=(str(tmp_path),))
    app = App(settings, _plugins.build_manager([], [Plugin()]))
    assert app.multi_model is not None
    (tmp_path / "m").mkdir()
    app.multi_model.load("m", str(tmp_path / "m"))
    first = app.model_target("m")
    assert first.at_hand is not None
    assert first.at_hand() == str(tmp_path / "m")
    kept = app.model_target("m")
    assert kept is app.model_target("m")
    assert kept.at_hand is not None
    assert kept.at_hand() == str(tmp_path / "m")
    absent = app.model_target("absent")
    assert absent.at_hand is not None
    assert absent.at_hand() is None
    assert app.model_target("absent") is not app.model_target("absent")
