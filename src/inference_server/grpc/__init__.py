"""The Open Inference Protocol over gRPC (``serve --grpc-port``): KServe's and Triton's ``GRPCInferenceService``,
a thin front over the app (see :mod:`.front`) and the wire format of its inference messages (:mod:`.wire`).

Needs the ``grpc`` extra (``grpcio``, ``protobuf``); nothing here is imported unless the port is set.
"""
