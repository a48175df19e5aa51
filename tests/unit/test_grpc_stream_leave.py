"""A ModelStreamInfer request cancelled while its response waits for room (a
client that reads slowly, then leaves) withdraws its item at once: its stream is
closed then, not when the garbage collector finds the request's frame. Before,
the abandoned stream went on stepping into its buffer and ended as a slow reader
("failed"), not as "left"."""

from __future__ import annotations

import asyncio
from typing import Any

from microbatch import Service, Stage
from microbatch.grpc.messages import message
from microbatch.grpc.server import GrpcConfig, GrpcServer
from microbatch.inference import InferenceModel
from tests.integration.test_pipeline_lifecycle import eventually
from tests.streams.models import Counter

HANG_GUARD_S = 30.0


class _Context:
    """What ``_answer_streamed`` asks of a call's context: no gRPC deadline."""

    def time_remaining(self) -> float | None:
        return None


def _forever() -> Any:
    request = message("ModelInferRequest")(model_name="counter", id="forever")
    given = request.inputs.add(name="input", datatype="BYTES", shape=[1, 1])
    given.contents.bytes_contents.append(b"pid")
    return request


async def test_a_request_cancelled_while_its_response_waits_leaves_its_stream() -> None:
    service = Service(Stage(Counter, mode="thread", max_batch_size=4), name="counter")
    server = GrpcServer({"counter": InferenceModel(service)}, GrpcConfig(port=0))
    first = asyncio.Event()
    no_room = asyncio.Event()  # never set: the response is never sent

    async def send(response: Any) -> None:
        first.set()
        await no_room.wait()

    async with service:
        answering = asyncio.create_task(server._answer_streamed(_forever(), _Context(), send))
        await asyncio.wait_for(first.wait(), HANG_GUARD_S)
        answering.cancel()
        await asyncio.gather(answering, return_exceptions=True)
        # ``answering`` (and its CancelledError's traceback) is still held here:
        # only an explicit close can have withdrawn the item
        await eventually(lambda: not service.stats().in_flight, HANG_GUARD_S)
        (stage,) = service.stats().stages
        assert stage.streams is not None
        assert (stage.streams.left, stage.streams.failed) == (1, 0)
        assert answering.cancelled()
