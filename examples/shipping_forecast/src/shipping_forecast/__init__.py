"""The shipping forecast model from the inference-server hook documentation, code as written there."""

from typing import Callable, Dict, Literal, Tuple

import orjson

import inference_server

DataType = str
PredictionType = Dict[str, str]
ModelType = Callable[[DataType], PredictionType]


@inference_server.plugin_hook
def model_fn(model_dir: str) -> ModelType:
    """Return a function that returns the weather forecast for a given location at sea"""
    return _predict_weather


def _predict_weather(location: DataType) -> PredictionType:
    """It's stormy everywhere"""
    return {
        "wind": "Southwesterly gale force 8 continuing",
        "sea_state": "Rough or very rough, occasionally moderate in southeast.",
        "weather": "Thundery showers.",
        "visibility": "Good, occasionally poor.",
    }


@inference_server.plugin_hook
def predict_fn(data: DataType, model: ModelType) -> PredictionType:
    """Invoke a prediction for given input data"""
    return model(data)


@inference_server.plugin_hook
def input_fn(input_data: bytes, content_type: Literal["application/json"]) -> DataType:
    """Deserialize JSON bytes and return ``location`` attribute"""
    return orjson.loads(input_data)["location"]


@inference_server.plugin_hook
def output_fn(prediction: PredictionType, accept: inference_server.MIMEAccept) -> Tuple[bytes, str]:
    """Serialize predictions as JSON"""
    assert accept.accept_json
    return orjson.dumps(prediction), "application/json"
