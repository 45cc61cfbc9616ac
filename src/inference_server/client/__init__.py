"""The client side: SDK-compatible serializers and deserializers, a Predictor, and decoders of streamed answers.

The serializers and deserializers have the SageMaker Python SDK v2 interface, so they drop into
``sagemaker.Predictor``; they use the server's codecs, so client and server agree by construction.
``Predictor.predict_stream`` reads a streamed answer (JSON Lines, server-sent events or raw chunks) as it arrives;
the decoders it uses take chunks from any other client too. :class:`V2Client` talks the Open Inference Protocol v2
(KServe, Triton) with binary tensors. :class:`AsyncPredictor` is the SDK's ``AsyncPredictor`` with these: it puts the
input in S3 or a local directory (or sends it inline), calls InvokeEndpointAsync, and reads the answer or the model's
error where the server writes it. This package never imports the server.
"""

from inference_server.client._async import (
    AsyncInferenceModelError,
    AsyncInferenceResponse,
    AsyncPredictor,
    ObjectNotExistedError,
    PollingTimeoutError,
    WaiterConfig,
)
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
from inference_server.client._stream import (
    JSONLinesDecoder,
    JSONLinesError,
    RawDecoder,
    SSEDecoder,
    StreamError,
    decode_stream,
    stream_decoder,
)
from inference_server.client._v2 import V2Client
from inference_server.codecs.streams import ServerSentEvent
from inference_server.codecs.v2 import InferenceResponse
from inference_server.errors import PredictionError

__all__ = [
    "ArrowDeserializer",
    "ArrowSerializer",
    "AsyncInferenceModelError",
    "AsyncInferenceResponse",
    "AsyncPredictor",
    "BaseDeserializer",
    "BaseSerializer",
    "BytesDeserializer",
    "CSVDeserializer",
    "CSVSerializer",
    "DataSerializer",
    "IdentitySerializer",
    "InferenceResponse",
    "JSONDeserializer",
    "JSONLinesDecoder",
    "JSONLinesDeserializer",
    "JSONLinesError",
    "JSONLinesSerializer",
    "JSONSerializer",
    "LibSVMSerializer",
    "NpzDeserializer",
    "NpzSerializer",
    "NumpyDeserializer",
    "NumpySerializer",
    "ObjectNotExistedError",
    "PandasDeserializer",
    "PollingTimeoutError",
    "PredictionError",
    "Predictor",
    "RawDecoder",
    "RecordDeserializer",
    "RecordSerializer",
    "SSEDecoder",
    "ServerSentEvent",
    "SimpleBaseDeserializer",
    "SimpleBaseSerializer",
    "SparseMatrixSerializer",
    "StreamDeserializer",
    "StreamError",
    "StringDeserializer",
    "StringSerializer",
    "TorchTensorDeserializer",
    "TorchTensorSerializer",
    "V2Client",
    "WaiterConfig",
    "decode_stream",
    "stream_decoder",
]
