"""``inference-server transform`` on several processes (``--workers``, a real Dask LocalCluster, a local Ray): outputs
byte for byte those of the local engine, a large file cut into parts transformed apart, the model loaded once per
worker process."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_transform_local import COUNTING, Job

LOADING = (
    COUNTING
    + """
    @inference_server.plugin_hook
    def model_fn(model_dir):
        with open(os.environ["CALLS_LOG"] + ".loads", "a") as log:
            log.write(f"{os.getpid()}\\n")
        return "model"
"""
)


#: The big file is cut into parts, transformed as separate tasks (the outputs must not show it).
PARTS = ("--part-size-mb", "1")


def _job(tmp_path: Path, servers: Any, plugin_site: Any) -> Job:
    plugin_site.add("loading", LOADING)
    job = Job(tmp_path, servers)
    for i in range(8):
        job.write(f"part-{i}.csv", b"".join(b"%d,%d\n" % (i, n) for n in range(300)))
    job.write("sub/deep.csv", b"fail\nlater\n")
    job.write("big.csv", b"".join(b"%d,%s\n" % (n, b"v" * (n % 1999)) for n in range(2600)))  # 2.6 MB: 3 parts
    return job


def test_dask_output_is_the_local_engines_byte_for_byte(tmp_path: Path, servers: Any, plugin_site: Any) -> None:
    """The same job on a LocalCluster and on the local engine writes identical files and reports the same failure;
    each Dask worker process loads the model once, however many files it transforms; the cluster's own INFO lines
    are not shown."""
    job = _job(tmp_path, servers, plugin_site)
    options = ("--split-type", "Line", "--batch-strategy", "MultiRecord", "--max-payload-in-mb", "1", *PARTS)
    local = job.run(*options, "--assemble-with", "Line")
    assert local.returncode == 1
    expected = {path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*.out")}
    assert len(expected) == 9
    job.output = tmp_path / "out-dask"
    (tmp_path / "calls.log.loads").unlink()
    dask = job.run(*options, "--assemble-with", "Line", "--engine", "dask", "--workers", "2")
    assert dask.returncode == 1, dask.stderr
    assert "failed: sub/deep.csv: the request of records 0 to 1 failed" in dask.stderr
    assert "9 of 10 files transformed (0 skipped, 1 failed)" in dask.stderr
    assert "distributed." not in dask.stderr  # the LocalCluster's INFO lines and dashboard hint stay quiet
    assert {
        path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*") if path.is_file()
    } == expected
    loads = (tmp_path / "calls.log.loads").read_text().split()
    assert 1 <= len(loads) <= 2
    assert len(set(loads)) == len(loads)


@pytest.mark.parametrize(
    ("engine", "module", "message"),
    [
        ("dask", "distributed", "pip install 'inference-server[dask]'"),
        ("ray", "ray", "--engine ray needs Ray: pip install 'inference-server[ray]'"),
    ],
)
def test_without_the_extra_the_error_names_it(tmp_path: Path, engine: str, module: str, message: str) -> None:
    """Without the engine's package installed, --engine stops with the pip command of its extra (exit 1)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(b"x\n")
    arguments = ["transform", str(tmp_path / "in"), str(tmp_path / "out"), "--engine", engine]
    code = f"import sys; sys.modules[{module!r}] = None; from inference_server import cli; "
    code += f"sys.exit(cli.main({arguments!r}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert message in result.stderr


def test_an_engine_address_without_dask_is_a_usage_error(tmp_path: Path) -> None:
    """--engine-address belongs to --engine dask: exit 2 saying so."""
    (tmp_path / "in").mkdir()
    command = [sys.executable, "-m", "inference_server", "transform", str(tmp_path / "in"), str(tmp_path / "o")]
    result = subprocess.run([*command, "--engine-address", "tcp://x"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "needs --engine dask or ray" in result.stderr


def test_local_worker_processes_match_one_process(tmp_path: Path, servers: Any, plugin_site: Any) -> None:
    """--workers 2 on the local engine: files shared among 2 processes, each loading the model once; the same
    outputs and the same failure as one process."""
    job = _job(tmp_path, servers, plugin_site)
    options = ("--split-type", "Line", "--batch-strategy", "SingleRecord", "--assemble-with", "Line", *PARTS)
    assert job.run(*options).returncode == 1
    expected = {path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*.out")}
    job.output = tmp_path / "out-processes"
    (tmp_path / "calls.log.loads").unlink()
    result = job.run(*options, "--workers", "2")
    assert result.returncode == 1, result.stderr
    assert "9 of 10 files transformed (0 skipped, 1 failed)" in result.stderr
    assert {
        path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*") if path.is_file()
    } == expected
    loads = (tmp_path / "calls.log.loads").read_text().split()
    assert len(loads) == len(set(loads)) <= 2


def test_ray_output_is_the_local_engines_byte_for_byte(tmp_path: Path, servers: Any, plugin_site: Any) -> None:
    """--engine ray (a local Ray on 127.0.0.1, 2 actors): the same files and the same failure as the local
    engine; each actor loads the model once; no deprecation warning from Ray Data."""
    job = _job(tmp_path, servers, plugin_site)
    options = ("--split-type", "Line", "--batch-strategy", "MultiRecord", "--assemble-with", "Line", *PARTS)
    assert job.run(*options).returncode == 1
    expected = {path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*.out")}
    job.output = tmp_path / "out-ray"
    (tmp_path / "calls.log.loads").unlink()
    result = job.run(*options, "--engine", "ray", "--workers", "2", env={"RAY_USAGE_STATS_ENABLED": "0"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "9 of 10 files transformed (0 skipped, 1 failed)" in result.stderr
    assert "failed: sub/deep.csv: the request of records 0 to 1 failed" in result.stderr
    assert "deprecated" not in result.stderr  # Ray called with its current API
    assert "max_restarts" not in result.stderr  # Ray's core: an actor with restarts and arguments in its object store
    assert {
        path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*") if path.is_file()
    } == expected
    loads = (tmp_path / "calls.log.loads").read_text().split()
    assert len(loads) == len(set(loads)) <= 2


FILE_TRANSFORMER = """
import sys

import ray
import ray.data

from inference_server.transform import TransformOptions
from inference_server.transform.ray import FileTransformer

root, output = sys.argv[1], sys.argv[2]
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
try:
    ray.data.DataContext.get_current().enable_progress_bars = False
    files = ray.data.from_items([{"path": f"{root}/{name}", "name": name} for name in ("a.csv", "b.csv")])
    options = TransformOptions(content_type="text/csv", split_type="Line", model_dir=root)
    done = files.map_batches(
        FileTransformer,
        fn_constructor_args=(root, output, options),
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=1),
    ).take_all()
finally:
    ray.shutdown()
for row in sorted(done, key=lambda row: row["name"]):
    print(row["name"], row["records"], row["failed"])
"""


def test_file_transformer_is_a_ray_data_udf(tmp_path: Path, servers: Any, plugin_site: Any) -> None:
    """FileTransformer, as the ray module's docstring uses it in a Ray Data pipeline of one's own: one row a file,
    with its counts and why it failed, the files transformed as the engines do."""
    plugin_site.add("loading", LOADING)
    job = Job(tmp_path, servers)
    job.write("a.csv", b"x,1\ny,2\n")
    job.write("b.csv", b"fail\n")
    script = [sys.executable, "-c", FILE_TRANSFORMER, str(job.input), str(job.output)]
    result = subprocess.run(script, env=job.env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = result.stdout.splitlines()
    assert rows[0] == "a.csv 2 "
    assert rows[1].startswith("b.csv 0 b.csv: the request of records 0 to 0 failed: predict_fn raised ValueError")
    assert job.out("a.csv") == b"X,1\nY,2\n"


SUMMING = """
    import os

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        with open(os.environ["CALLS_LOG"] + ".loads", "a") as log:
            log.write(f"{os.getpid()}\\n")
        return "model"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        with open(os.environ["CALLS_LOG"], "a") as log:
            log.write(f"{len(data)}\\n")
        return data.sum(axis=1, keepdims=True)
"""

MAP_PARTITIONS = """
import sys

import dask.dataframe as dd
import pandas
from distributed import Client, LocalCluster

from inference_server.transform.dask import map_partitions

frame = pandas.DataFrame({"a": range(1000), "b": [0.5] * 1000}, index=range(5000, 6000))
with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster:
    with Client(cluster):
        features = dd.from_pandas(frame, npartitions=4)
        scores = map_partitions(features, meta={"total": "f8"}, max_payload_in_mb=1, batch_strategy=sys.argv[1])
        assert scores.npartitions == 4
        got = scores.compute()
        assert list(got.index) == list(range(5000, 6000)), got.index
        assert got["total"].tolist() == [a + 0.5 for a in range(1000)], got
        assert str(got["total"].dtype) == "float64"
print("ok")
"""


@pytest.mark.parametrize("strategy", ["MultiRecord", "SingleRecord"])
def test_map_partitions_predicts_a_dask_dataframe_with_its_index(
    strategy: str, tmp_path: Path, servers: Any, plugin_site: Any
) -> None:
    """map_partitions on a LocalCluster: each partition's rows go through the hooks as CSV records (one request
    per partition with MultiRecord, one per row with SingleRecord) and come back as a Dask DataFrame with the
    input's index and meta's columns and dtypes; the model is loaded once per worker."""
    plugin_site.add("summing", SUMMING)
    env = servers.environment(None, {"CALLS_LOG": str(tmp_path / "calls.log")})
    script = [sys.executable, "-c", MAP_PARTITIONS, strategy]
    result = subprocess.run(script, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
    calls = [int(size) for size in (tmp_path / "calls.log").read_text().split()]
    assert sum(calls) == 1000
    assert calls == ([250] * 4 if strategy == "MultiRecord" else [1] * 1000)
    loads = (tmp_path / "calls.log.loads").read_text().split()
    assert len(loads) == len(set(loads)) <= 2


def test_map_partitions_refuses_media_types_it_cannot_read_back(tmp_path: Path) -> None:
    """Only CSV and JSON Lines frames: another content type is a TransformError before anything runs."""
    import dask.dataframe as dd
    import pandas

    from inference_server.errors import TransformError
    from inference_server.transform.dask import map_partitions

    frame = dd.from_pandas(pandas.DataFrame({"a": [1]}), npartitions=1)
    with pytest.raises(TransformError, match="text/csv or application/jsonlines, not application/x-npy"):
        map_partitions(frame, meta={"a": "f8"}, accept="application/x-npy")


def test_ray_fail_fast_stops_starting_files(tmp_path: Path, servers: Any, plugin_site: Any) -> None:
    """--engine ray --fail-fast: the first failure stops the job; the files not reported done by then are failed
    as stopped, and most never ran (one actor: at most the few in flight at the stop finish)."""
    plugin_site.add("loading", LOADING)
    job = Job(tmp_path, servers)
    job.write("0.csv", b"fail\n")
    for i in range(1, 7):
        job.write(f"{i}.csv", b"slow\n")
    options = ("--split-type", "Line", "--engine", "ray", "--workers", "1", "--fail-fast")
    result = job.run(*options, env={"RAY_USAGE_STATS_ENABLED": "0", "CALL_DELAY": "3"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "failed: 0.csv: the request of records 0 to 0 failed" in result.stderr
    stopped = result.stderr.count("stopped: another file failed first (--fail-fast)")
    assert stopped >= 3, result.stderr[-3000:]
    assert len(list(job.output.rglob("*.out"))) <= 3


def test_a_dask_dashboard_is_asked_for_and_needs_its_packages(tmp_path: Path) -> None:
    """--dask-dashboard belongs to a LocalCluster of --engine dask (exit 2 otherwise), and without bokeh the job
    stops saying what to install, before any file."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("x")
    command = [sys.executable, "-m", "inference_server", "transform", str(tmp_path / "in"), str(tmp_path / "out")]
    dashboard = ["--dask-dashboard", "127.0.0.1:0"]
    result = subprocess.run([*command, *dashboard], capture_output=True, text=True, timeout=60)
    assert (result.returncode, "--dask-dashboard needs --engine dask" in result.stderr) == (2, True)
    if importlib.util.find_spec("bokeh") is not None:
        pytest.skip("bokeh is installed here: the missing-package path cannot be shown")
    result = subprocess.run([*command, *dashboard, "--engine", "dask"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "--dask-dashboard needs bokeh, which Dask's dashboard is drawn with: pip install bokeh" in result.stderr
    assert not (tmp_path / "out" / "a.txt.out").exists()


CRASHING = """
    import os

    import inference_server

    @inference_server.plugin_hook
    def input_fn(input_data, content_type):
        return bytes(input_data)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if data.startswith(b"crash"):
            os._exit(3)  # the process dies, as in a crash of the model or at the OOM killer's hand
        return data.upper()

    @inference_server.plugin_hook
    def output_fn(prediction, accept):
        return prediction, "application/octet-stream"
"""

#: A line of the engine's below ERROR: Dask's in the job's process (our format: ``[WARNING] distributed.nanny: ...``)
#: and in its worker processes (``- distributed.worker - WARNING -``), Ray's (``\tINFO worker.py:...``) and its C++
#: core's (``[2026-12-05 07:19:41,739 W 7119 7119] core_worker.cc``), and Python's warnings.
BELOW_ERROR = re.compile(
    r"\[(DEBUG|INFO|WARNING)\]| - (DEBUG|INFO|WARNING) - |\t(DEBUG|INFO|WARNING) "
    r"|^\[[-\d :,.]+ [DIW] \d+ \d+\]|Warning: "
)


def _crash_job(tmp_path: Path, servers: Any, plugin_site: Any, files: int = 4) -> Job:
    plugin_site.add("crashing", CRASHING)
    job = Job(tmp_path, servers)
    for i in range(files):
        job.write(f"part-{i}.csv", b"".join(b"%d,%d\n" % (i, n) for n in range(50)))
    return job


@pytest.mark.parametrize(("engine", "files"), [("dask", 4), ("ray", 4), ("ray", 1)])
def test_quiet_shows_no_line_of_the_engine(
    engine: str, files: int, tmp_path: Path, servers: Any, plugin_site: Any
) -> None:
    """--quiet on --engine dask and ray: a job that succeeds prints nothing at all, not one line of the engine's own
    (Ray's start, its authentication token, its core's error about actor restarts, its warning about more actors than
    files; Dask's cluster)."""
    job = _crash_job(tmp_path, servers, plugin_site, files)
    options = ("--split-type", "Line", "--content-type", "text/csv", "--model-dir", str(tmp_path), "--quiet")
    result = job.run(*options, "--engine", engine, "--workers", "2")
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")
    assert sorted(path.name for path in job.output.rglob("*")) == [f"part-{i}.csv.out" for i in range(files)]


@pytest.mark.parametrize("engine", ["dask", "ray"])
def test_a_file_that_kills_its_worker_fails_alone(engine: str, tmp_path: Path, servers: Any, plugin_site: Any) -> None:
    """A file whose model call kills the worker process fails with the reason and the other files are transformed
    (Dask gives up on it after its workers died, Ray's pool replaces the dead actor, neither retries it without end);
    under --quiet, the engine says nothing below error level. On Dask a file that was waiting on a worker as it died
    may be given up with it (Dask counts it as suspect too): each file either fails so or is transformed whole."""
    job = _crash_job(tmp_path, servers, plugin_site)
    job.write("crash.csv", b"crash\n")
    options = ("--split-type", "Line", "--content-type", "text/csv", "--model-dir", str(tmp_path), "--quiet")
    result = job.run(*options, "--engine", engine, "--workers", "2")
    assert result.returncode == 1, result.stderr[-3000:]
    failed = [line for line in result.stderr.splitlines() if line.startswith("failed: ")]
    reason = "KilledWorker:" if engine == "dask" else "its Ray actor died: "
    names = [line.removeprefix("failed: ").split(": ", 1)[0] for line in failed]
    assert "crash.csv" in names, failed
    assert all(reason in line for line in failed), failed
    if engine == "ray":
        assert names == ["crash.csv"], failed
    assert len(names) < 5, failed  # the job went on: not every file was given up
    assert [line for line in (result.stderr + result.stdout).splitlines() if BELOW_ERROR.search(line)] == []
    for i in range(4):
        if f"part-{i}.csv" not in names:
            assert job.out(f"part-{i}.csv") == b"".join(b"%d,%d\n" % (i, n) for n in range(50)).upper()
