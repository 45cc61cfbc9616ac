"""The protocol's messages, from :mod:`._descriptor` in a descriptor pool of this module's own: a process may import
``tritonclient.grpc`` too, whose generated classes hold the same names in protobuf's default pool."""

from __future__ import annotations

import functools
from typing import Any

#: The gRPC service's full name, as clients call it.
SERVICE = "inference.GRPCInferenceService"


@functools.cache
def _pool() -> Any:
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool
    except ImportError as exc:  # (protobuf comes with the grpc extra)
        raise ImportError(
            "the Open Inference Protocol over gRPC needs grpcio and protobuf: pip install 'inference-server[grpc]'"
        ) from exc
    from inference_server.grpc._descriptor import FILE

    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(FILE))
    return pool


@functools.cache
def message(name: str) -> Any:
    """The class of message ``name`` (``ModelInferRequest``; a nested one: ``ModelInferResponse.InferOutputTensor``)."""
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"inference.{name}"))
