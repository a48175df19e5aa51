"""The Open Inference Protocol v2's gRPC messages, built from the vendored descriptor.

``_proto/open_inference_grpc.proto`` is the protocol's published ``.proto``
(kserve/open-inference-protocol, Apache-2.0, see ``_proto/LICENSE``);
``open_inference_grpc.binpb`` is its compiled descriptor set
(``python -m grpc_tools.protoc --descriptor_set_out=open_inference_grpc.binpb
open_inference_grpc.proto``; a test checks that the two agree).
``_proto/stream_extension.proto`` (ours) adds the response message of the
protocol's streaming extension, ``ModelStreamInfer`` (Triton's; see
:mod:`microbatch.grpc.stream_call`), compiled the same way to
``stream_extension.binpb``. The messages live in
a descriptor pool of their own, so a process may also import another copy of the
same protocol (``tritonclient``'s, KServe's) without a clash, and no generated code
ties the package to one protobuf version.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["DESCRIPTOR_SET", "DESCRIPTOR_SETS", "SERVICE", "message"]

DESCRIPTOR_SET = Path(__file__).parent / "_proto" / "open_inference_grpc.binpb"
"""The compiled descriptor set of the vendored ``.proto``."""

DESCRIPTOR_SETS = (DESCRIPTOR_SET, DESCRIPTOR_SET.with_name("stream_extension.binpb"))
"""Every compiled descriptor set, each after those it imports."""

SERVICE = "inference.GRPCInferenceService"
"""The full name of the protocol's gRPC service."""


def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for path in DESCRIPTOR_SETS:
        for file in descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file:
            pool.Add(file)
    return pool


_POOL = _pool()


@functools.cache
def message(name: str) -> Any:
    """The message class ``inference.<name>`` (``ModelInferRequest``, ...)."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"inference.{name}"))
