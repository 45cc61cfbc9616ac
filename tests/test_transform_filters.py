"""InputFilter, JoinSource and OutputFilter on CSV and JSON records, as SageMaker's documentation shows them."""

from __future__ import annotations

import pytest

from inference_server.errors import ConfigurationError, TransformError
from inference_server.transform import filters


def _processing(
    content_type: str, input_filter: str = "$", join: str = "None", output_filter: str = "$"
) -> filters.Processing:
    processing = filters.Processing.create(content_type, input_filter, join, output_filter)
    assert processing is not None
    return processing


def test_the_defaults_do_nothing() -> None:
    """$, None and $ need no processing at all."""
    assert filters.Processing.create("text/csv", "$", "None", "$") is None


@pytest.mark.parametrize(
    ("expression", "row", "expected"),
    [
        ("$[1:]", b"id7,1.5,2", b"1.5,2"),  # the documentation's "drop the ID column"
        ("$[0,-1]", b"a,b,c,d", b"a,d"),
        ("$[2]", b"a,b,c", b"c"),
        ("$[:2]", b'a,"b,c",d', b'a,"b,c"'),
        ("$[*]", b"a,b", b"a,b"),
    ],
)
def test_csv_rows_are_arrays_of_cells(expression: str, row: bytes, expected: bytes) -> None:
    """On CSV, a row is an array: slices, indexes (negative from the end), unions and * pick its cells."""
    assert _processing("text/csv", expression).filter_input(row, "r") == expected


@pytest.mark.parametrize(
    ("expression", "record", "expected"),
    [
        ("$.features", b'{"id": 1, "features": [1, 2]}', b"[1,2]"),
        ("$['id','features']", b'{"id": 1, "features": [1], "x": 0}', b'{"id":1,"features":[1]}'),
        ("$.features[1:]", b'{"features": [1, 2, 3]}', b"[2,3]"),
        ("$.a.b", b'{"a": {"b": "c"}}', b'"c"'),
    ],
)
def test_json_records_are_selected_by_member_and_index(expression: str, record: bytes, expected: bytes) -> None:
    """On JSON, members by name (one: its value; several: an object of them), then indexes and slices."""
    assert _processing("application/jsonlines", expression).filter_input(record, "r") == expected


def test_csv_join_appends_the_answer_and_the_output_filter_picks_from_both() -> None:
    """JoinSource Input on CSV: the input row then the answer's cells; $[0,-1] keeps the ID and the prediction."""
    processing = _processing("text/csv", "$[1:]", "Input", "$[0,-1]")
    assert processing.output(b"id7,1.5,2", b"0.93", "r") == b"id7,0.93"
    assert _processing("text/csv", join="Input").output(b"a,b", b"x,y", "r") == b"a,b,x,y"


def test_json_join_adds_sagemaker_output_or_wraps_a_non_object() -> None:
    """JoinSource Input on JSON: an object gets SageMakerOutput; anything else goes under SageMakerInput."""
    processing = _processing("application/json", join="Input")
    assert processing.output(b'{"id": 1}', b"[0.5]", "r") == b'{"id":1,"SageMakerOutput":[0.5]}'
    assert processing.output(b"[1, 2]", b"3", "r") == b'{"SageMakerInput":[1,2],"SageMakerOutput":3}'
    picked = _processing("application/json", join="Input", output_filter="$['id','SageMakerOutput']")
    assert picked.output(b'{"id": 1, "f": [9]}', b"0.5", "r") == b'{"id":1,"SageMakerOutput":0.5}'


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("features", "starts with \\$"),
        ("$..features", "cannot read it from character 2"),
        ("$[a:b]", "not a slice of integers"),
        ("$[?(@.x)]", "neither indexes"),
    ],
)
def test_expressions_outside_the_subset_are_refused_before_the_job(expression: str, message: str) -> None:
    """Filters outside SageMaker's documented subset are a ConfigurationError saying where."""
    with pytest.raises(ConfigurationError, match=message):
        filters.Processing.create("text/csv", expression, "None", "$")


def test_filters_need_csv_or_json() -> None:
    """Filters on another media type are refused before the job (SageMaker supports CSV and JSON only)."""
    with pytest.raises(ConfigurationError, match="CSV and JSON records"):
        filters.Processing.create("application/x-npy", "$[1:]", "None", "$")


def test_a_record_the_filter_does_not_fit_fails_with_where_and_why() -> None:
    """An index past the row's end or a missing member fails its file, naming the record and the reason."""
    with pytest.raises(TransformError, match=r"a.csv: record 3: the input filter: index 5 of an array of 2"):
        _processing("text/csv", "$[5]").filter_input(b"a,b", "a.csv: record 3")
    with pytest.raises(TransformError, match="no member 'features'"):
        _processing("application/json", "$.features").filter_input(b'{"id": 1}', "r")
