"""Transform jobs reading and writing ``s3://`` through s3fs, against a real local S3 server (moto's, on a free port
of 127.0.0.1); local paths are covered by the other transform tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import S3_CREDENTIALS as CREDENTIALS
from tests.test_transform_local import COUNTING


def _transform(s3: Any, servers: Any, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = servers.environment(None, {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3.endpoint})
    env["CALLS_LOG"] = str(tmp_path / "calls.log")
    command = [sys.executable, "-m", "inference_server", "transform", "s3://jobs/in/", "s3://jobs/out/", *options]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_an_s3_prefix_in_and_out(s3: Any, servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """Every object under s3://jobs/in/ becomes s3://jobs/out/<relative key>.out; a file whose job fails midway
    leaves no object behind (its upload is aborted, never completed)."""
    plugin_site.add("counting", COUNTING)
    s3.put_object(Bucket="jobs", Key="in/a.txt", Body=b"ab\ncd\n")
    s3.put_object(Bucket="jobs", Key="in/sub/b.txt", Body=b"ef\n")
    s3.put_object(Bucket="jobs", Key="in/c.txt", Body=b"ok\n" * 3 + b"fail\n")
    result = _transform(s3, servers, tmp_path, "--split-type", "Line", "--batch-strategy", "SingleRecord")
    assert result.returncode == 1
    assert "failed: c.txt" in result.stderr
    keys = sorted(item["Key"] for item in s3.list_objects_v2(Bucket="jobs", Prefix="out/")["Contents"])
    assert keys == ["out/a.txt.out", "out/sub/b.txt.out"]
    assert s3.get_object(Bucket="jobs", Key="out/a.txt.out")["Body"].read() == b"ABCD"
    assert s3.get_object(Bucket="jobs", Key="out/sub/b.txt.out")["Body"].read() == b"EF"


def test_resume_on_s3_skips_finished_outputs(s3: Any, servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """--resume compares the objects' modification times, as it does files' on disk."""
    plugin_site.add("counting", COUNTING)
    s3.put_object(Bucket="jobs", Key="in/a.txt", Body=b"ab\n")
    assert _transform(s3, servers, tmp_path).returncode == 0
    again = _transform(s3, servers, tmp_path, "--resume")
    assert again.returncode == 0, again.stderr
    assert "(1 skipped, 0 failed)" in again.stderr
