"""``inference-server transform --engine dask``: a real Dask LocalCluster of 2 worker processes, outputs byte for
byte those of the local engine, the model loaded once per Dask worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _job(tmp_path: Path, servers: Any, plugin_site: Any) -> Job:
    plugin_site.add("loading", LOADING)
    job = Job(tmp_path, servers)
    for i in range(8):
        job.write(f"part-{i}.csv", b"".join(b"%d,%d\n" % (i, n) for n in range(300)))
    job.write("sub/deep.csv", b"fail\nlater\n")
    return job


def test_dask_output_is_the_local_engines_byte_for_byte(tmp_path: Path, servers: Any, plugin_site: Any) -> None:
    """The same job on a LocalCluster and on the local engine writes identical files and reports the same failure;
    each Dask worker process loads the model once, however many files it transforms."""
    job = _job(tmp_path, servers, plugin_site)
    options = ("--split-type", "Line", "--batch-strategy", "MultiRecord", "--max-payload-in-mb", "1")
    local = job.run(*options, "--assemble-with", "Line")
    assert local.returncode == 1
    expected = {path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*.out")}
    assert len(expected) == 8
    job.output = tmp_path / "out-dask"
    (tmp_path / "calls.log.loads").unlink()
    dask = job.run(*options, "--assemble-with", "Line", "--engine", "dask", "--workers", "2")
    assert dask.returncode == 1, dask.stderr
    assert "failed: sub/deep.csv: sub/deep.csv: the request of records 0 to 1 failed" in dask.stderr
    assert "8 of 9 files transformed (0 skipped, 1 failed)" in dask.stderr
    assert {path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*.out")} == expected
    loads = (tmp_path / "calls.log.loads").read_text().split()
    assert 1 <= len(loads) <= 2
    assert len(set(loads)) == len(loads)


def test_without_the_extra_the_error_names_it(tmp_path: Path) -> None:
    """Without dask.distributed installed, --engine dask stops with the pip command of the extra (exit 1)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(b"x\n")
    code = (
        "import sys; sys.modules['distributed'] = None; from inference_server import cli; "
        f"sys.exit(cli.main(['transform', {str(tmp_path / 'in')!r}, {str(tmp_path / 'out')!r}, '--engine', 'dask']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "pip install 'inference-server[dask]'" in result.stderr


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
    options = ("--split-type", "Line", "--batch-strategy", "SingleRecord", "--assemble-with", "Line")
    assert job.run(*options).returncode == 1
    expected = {path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*.out")}
    job.output = tmp_path / "out-processes"
    (tmp_path / "calls.log.loads").unlink()
    result = job.run(*options, "--workers", "2")
    assert result.returncode == 1, result.stderr
    assert "8 of 9 files transformed (0 skipped, 1 failed)" in result.stderr
    assert {path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*.out")} == expected
    loads = (tmp_path / "calls.log.loads").read_text().split()
    assert len(loads) == len(set(loads)) <= 2


def test_ray_output_is_the_local_engines_byte_for_byte(tmp_path: Path, servers: Any, plugin_site: Any) -> None:
    """--engine ray (a local Ray on 127.0.0.1, 2 actors): the same files and the same failure as the local
    engine; each actor loads the model once."""
    job = _job(tmp_path, servers, plugin_site)
    options = ("--split-type", "Line", "--batch-strategy", "MultiRecord", "--assemble-with", "Line")
    assert job.run(*options).returncode == 1
    expected = {path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*.out")}
    job.output = tmp_path / "out-ray"
    (tmp_path / "calls.log.loads").unlink()
    result = job.run(*options, "--engine", "ray", "--workers", "2", env={"RAY_USAGE_STATS_ENABLED": "0"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "8 of 9 files transformed (0 skipped, 1 failed)" in result.stderr
    assert "failed: sub/deep.csv: sub/deep.csv: the request of records 0 to 1 failed" in result.stderr
    assert {path.relative_to(job.output): path.read_bytes() for path in job.output.rglob("*.out")} == expected
    loads = (tmp_path / "calls.log.loads").read_text().split()
    assert len(loads) == len(set(loads)) <= 2
