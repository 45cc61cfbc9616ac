"""The client side: SDK-compatible serializers and deserializers, and a Predictor.

The serializers and deserializers have the SageMaker Python SDK v2 interface, so they drop into
``sagemaker.Predictor``; they use the server's codecs, so client and server agree by construction.
This package never imports the server.
"""

from inference_server.client._deserializers import (
    ArrowDeserializer,
    BaseDeserializer,
    BytesDeserializer,
    CSVDeserializer,
    JSONDeserializer,
    JSONLinesDeserializer,
    NpzDeserializer,
    NumpyDeserializer,
    PandasDeserializer,
    StreamDeserializer,
    StringDeserializer,
)
from inference_server.client._predictor import Predictor
from inference_server.client._serializers import (
    ArrowSerializer,
    BaseSerializer,
    CSVSerializer,
    IdentitySerializer,
    JSONLinesSerializer,
    JSONSerializer,
    NpzSerializer,
    NumpySerializer,
)
from inference_server.errors import PredictionError

__all__ = [
    "ArrowDeserializer",
    "ArrowSerializer",
    "BaseDeserializer",
    "BaseSerializer",
    "BytesDeserializer",
    "CSVDeserializer",
    "CSVSerializer",
    "IdentitySerializer",
    "JSONDeserializer",
    "JSONLinesDeserializer",
    "JSONLinesSerializer",
    "JSONSerializer",
    "NpzDeserializer",
    "NpzSerializer",
    "NumpyDeserializer",
    "NumpySerializer",
    "PandasDeserializer",
    "PredictionError",
    "Predictor",
    "StreamDeserializer",
    "StringDeserializer",
]
