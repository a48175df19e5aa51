"""LitServe streams of the simulated step model.

``STREAM_LOOP=batched python stream_litserve.py PORT``: ``stream=True`` with batching
(``max_batch_size=64``, ``batch_timeout=10 ms``): ``predict`` is a generator over
the batch, which runs until its longest item ends (lockstep).

``STREAM_LOOP=continuous python stream_litserve.py PORT``: LitServe's ``ContinuousBatchingLoop``
(items join and leave between steps; ``max_batch_size=64``).

``POST /predict`` with ``{"n": chunks}``; each chunk is one line ``@``.

``STREAM_LOOP=openai python stream_litserve.py PORT``: the batched streams of
``batched`` behind LitServe's ``OpenAISpec``: ``POST /v1/chat/completions`` with
``"stream": true`` streams ``max_tokens`` chunks ``@`` as OpenAI's Server-Sent Events
(the items of a batch that ended early get empty deltas until it ends).
"""

import os
import sys
from pathlib import Path

import litserve as ls
from litserve.loops import ContinuousBatchingLoop, Output
from litserve.utils import LitAPIStatus

sys.path.insert(0, str(Path(__file__).parent))
from stream_models import CHUNK, MAX_ACTIVE, simulate_step


class Batched(ls.LitAPI):
    """Lockstep: the batch steps together until its longest item ends."""

    def setup(self, device):
        pass

    def decode_request(self, request):
        return int(request["n"])

    def batch(self, inputs):
        return list(inputs)

    def predict(self, lengths):
        for position in range(1, max(lengths) + 1):
            simulate_step(len(lengths))
            yield [position <= n for n in lengths]

    def unbatch(self, outputs):
        yield from outputs

    def encode_response(self, outputs):
        for live in outputs:
            yield [CHUNK + "\n" if alive else "" for alive in live]


class Continuous(ls.LitAPI):
    """Step-wise with LitServe's continuous-batching loop."""

    def setup(self, device):
        self.active = {}  # uid -> [n, position]

    def add_request(self, uid, request):
        self.active[uid] = [int(request["n"]), 0]

    def has_active_requests(self):
        return bool(self.active)

    def has_capacity(self):
        return len(self.active) < MAX_ACTIVE

    def step(self, prev_outputs):
        simulate_step(len(self.active))
        outputs = []
        for uid, state in list(self.active.items()):
            state[1] += 1
            outputs.append(Output(uid, CHUNK + "\n", LitAPIStatus.OK))
            if state[1] >= state[0]:
                outputs.append(Output(uid, "", LitAPIStatus.FINISH_STREAMING))
                del self.active[uid]
        return outputs

    def encode_response(self, output):
        return output


class OpenAIBatched(ls.LitAPI):
    """Lockstep behind the OpenAI spec: a request's ``max_tokens`` chunks."""

    def setup(self, device):
        pass

    def batch(self, inputs):
        return list(inputs)

    def predict(self, requests, context):
        lengths = [int(request.max_tokens or 16) for request in requests]
        for position in range(1, max(lengths) + 1):
            simulate_step(len(lengths))
            yield [CHUNK if position <= n else "" for n in lengths]

    def unbatch(self, output):
        return output

    def encode_response(self, output_stream, context):
        for outputs in output_stream:
            yield [{"role": "assistant", "content": chunk} for chunk in outputs]


def make_server(kind: str) -> ls.LitServer:
    if kind == "batched":
        api = Batched(max_batch_size=MAX_ACTIVE, batch_timeout=0.01, stream=True)
    elif kind == "openai":
        api = OpenAIBatched(max_batch_size=MAX_ACTIVE, batch_timeout=0.01, spec=ls.OpenAISpec())
    else:
        api = Continuous(max_batch_size=MAX_ACTIVE, stream=True, loop=ContinuousBatchingLoop())
    return ls.LitServer(api, accelerator="cpu", workers_per_device=1)


if __name__ == "__main__":
    make_server(os.environ.get("STREAM_LOOP", "batched")).run(
        port=int(sys.argv[1]), generate_client_file=False
    )
