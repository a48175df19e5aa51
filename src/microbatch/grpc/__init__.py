"""The Open Inference Protocol v2 over gRPC (``pip install microbatch[grpc]``).

``microbatch serve MODULE:ATTR --grpc-port 8001`` serves it beside HTTP; in code,
:class:`GrpcServer` serves any servables (wrapped in
:class:`~microbatch.inference.InferenceModel`) on a ``grpc.aio`` server: the
protocol's unary methods, and ``ModelStreamInfer`` (Triton's streaming extension,
:mod:`microbatch.grpc.stream_call`) for streams of chunks.
"""

from .server import GrpcConfig, GrpcServer

__all__ = ["GrpcConfig", "GrpcServer"]
