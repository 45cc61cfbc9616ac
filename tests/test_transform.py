"""``inference_server.transform``: the options' SageMaker bounds, and ``BatchPredictor``, the hooks without HTTP."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inference_server
from inference_server import testing
from inference_server.errors import ConfigurationError, TransformError
from inference_server.transform import BatchPredictor, TransformOptions


class Doubling:
    """Doubles numeric CSV rows and remembers the shape of every batch it was given."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    @inference_server.plugin_hook
    def model_fn(self, model_dir: str) -> str:
        return "model"

    @inference_server.plugin_hook
    def predict_fn(self, data: np.ndarray, model: Any) -> np.ndarray:
        self.shapes.append(data.shape)
        return data * 2


@pytest.fixture
def doubling(only_plugin: Callable[[Any], Any]) -> Doubling:
    """Only the defaults and the doubling plugin, for this test."""
    plugin: Doubling = only_plugin(Doubling())
    return plugin


def test_predict_is_one_invocation_without_http(doubling: Doubling, tmp_path: Path) -> None:
    """BatchPredictor.predict: the body through input_fn, predict_fn, output_fn, answered in the asked type."""
    predictor = BatchPredictor(model_dir=str(tmp_path))
    assert predictor.predict(b"1,2\n3,4\n", "text/csv", "text/csv") == (b"2.0,4.0\n6.0,8.0\n", "text/csv")
    assert doubling.shapes == [(2, 2)]


def test_predict_records_packs_lines_as_a_transform_job_does(doubling: Doubling, tmp_path: Path) -> None:
    """predict_records (here through testing.batch_predictor): MultiRecord lines share requests up to the payload
    limit, each with its newline; SingleRecord sends each line alone; a line over the limit is a TransformError
    naming it."""
    predictor = testing.batch_predictor(model_dir=str(tmp_path))
    lines = [b"1,2", b"3,4\n", b"5,6\r\n"]
    assert list(predictor.predict_records(lines, "text/csv", "text/csv")) == [b"2.0,4.0\n6.0,8.0\n10.0,12.0\n"]
    assert doubling.shapes == [(3, 2)]
    single = predictor.predict_records(lines, "text/csv", "text/csv", batch_strategy="SingleRecord")
    assert [answer.strip() for answer in single] == [b"2.0,4.0", b"6.0,8.0", b"10.0,12.0"]
    assert doubling.shapes[1:] == [(1, 2)] * 3
    huge = [b"1,2", b"3" * (2 << 20)]
    with pytest.raises(TransformError, match=r"record 1 \(at byte 4\) is 2097153 bytes, over the limit of 1048576"):
        list(predictor.predict_records(huge, "text/csv", max_payload_in_mb=1))


def test_options_keep_sagemakers_bounds() -> None:
    """Concurrency x payload over 100 MB, a payload over 100 MB, and a part size below 1 MB are refused."""
    with pytest.raises(ConfigurationError, match="4 x 30 MB = 120 MB"):
        TransformOptions(max_concurrent_transforms=4, max_payload_in_mb=30)
    with pytest.raises(ConfigurationError, match="max payload 101 MB"):
        TransformOptions(max_payload_in_mb=101)
    with pytest.raises(ConfigurationError, match="part size 0 MB"):
        TransformOptions(part_size_mb=0)
    assert TransformOptions(split_type="None").part_size is None
    assert TransformOptions(split_type="Line", part_size_mb=2).part_size == 2 << 20
