"""The shipping forecast plugin, tested with inference-server's testing kit as a model author would."""

import json

import shipping_forecast

from inference_server import testing

EXPECTED = {
    "wind": "Southwesterly gale force 8 continuing",
    "sea_state": "Rough or very rough, occasionally moderate in southeast.",
    "weather": "Thundery showers.",
    "visibility": "Good, occasionally poor.",
}


class JSONSerializer:
    """The SageMaker SDK's serializer interface, as a model author without the SDK writes it."""

    CONTENT_TYPE = "application/json"

    def serialize(self, data):
        return json.dumps(data)


class JSONDeserializer:
    """The SageMaker SDK's deserializer interface."""

    ACCEPT = ("application/json",)

    def deserialize(self, stream, content_type):
        try:
            return json.load(stream)
        finally:
            stream.close()


def test_prediction_is_ok():
    """A location in, the stormy forecast out, through every hook."""
    prediction = testing.predict(
        {"location": "Fair Isle"}, serializer=JSONSerializer(), deserializer=JSONDeserializer()
    )
    assert prediction == EXPECTED


def test_prediction_request_is_ok():
    """The low-level request API returns the JSON response."""
    response = testing.post_invocations(
        json={"location": "Fair Isle"}, content_type="application/json", headers={"Accept": "application/json"}
    )
    assert response.status_code == 200
    assert response.content_type == "application/json"
    assert response.json == EXPECTED


def test_plugin_is_registered():
    """The entry point in pyproject.toml registers the module as a plugin."""
    assert testing.plugin_is_registered(shipping_forecast)


def test_hooks_are_valid():
    """Every hook the package defines is a valid, registered implementation."""
    for hook in (
        shipping_forecast.model_fn,
        shipping_forecast.predict_fn,
        shipping_forecast.input_fn,
        shipping_forecast.output_fn,
    ):
        assert testing.hookimpl_is_valid(hook)
