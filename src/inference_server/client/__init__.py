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
    RecordDeserializer,
    SimpleBaseDeserializer,
    StreamDeserializer,
    StringDeserializer,
    TorchTensorDeserializer,
)
from inference_server.client._predictor import Predictor
from inference_server.client._serializers import (
    ArrowSerializer,
    BaseSerializer,
    CSVSerializer,
    DataSerializer,
    IdentitySerializer,
    JSONLinesSerializer,
    JSONSerializer,
    LibSVMSerializer,
    NpzSerializer,
    NumpySerializer,
    RecordSerializer,
    SimpleBaseSerializer,
    SparseMatrixSerializer,
    StringSerializer,
    TorchTensorSerializer,
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
    "DataSerializer",
    "IdentitySerializer",
    "JSONDeserializer",
    "JSONLinesDeserializer",
    "JSONLinesSerializer",
    "JSONSerializer",
    "LibSVMSerializer",
    "NpzDeserializer",
    "NpzSerializer",
    "NumpyDeserializer",
    "NumpySerializer",
    "PandasDeserializer",
    "PredictionError",
    "Predictor",
    "RecordDeserializer",
    "RecordSerializer",
    "SimpleBaseDeserializer",
    "SimpleBaseSerializer",
    "SparseMatrixSerializer",
    "StreamDeserializer",
    "StringDeserializer",
    "StringSerializer",
    "TorchTensorDeserializer",
    "TorchTensorSerializer",
]
