"""A small generative model served step-wise: a character-level language model
(a GRU in torch) that streams its text one character per step.

The model is trained at worker start-up, for a few seconds, on text every Python
installation has (the Zen of Python and the docstrings of some standard modules),
so it needs no file and no download. Its output reads like a drunk standard
library: the point is the serving, not the prose.

Each request's state (the GRU's hidden vector, its last character, how many it has
made) stays in the worker process; between two steps finished requests leave and
new ones join, so a short request never waits for a long one.

Serve it::

    microbatch serve examples.generate:service
    curl -N localhost:8000/stream --json '{"prompt": "Beautiful is", "max_tokens": 40}'

or, as Triton's generate extension (the chunks of one request as Server-Sent Events)::

    curl -N localhost:8000/v2/models/generate/generate_stream \
        -d '{"prompt": "Beautiful is", "max_tokens": 40}'

It declares itself a text generator (``completion_model``), so OpenAI's client
works too (``/v1/completions``, ``/v1/chat/completions``; model ``generate``)::

    client = openai.OpenAI(base_url="http://localhost:8000/v1", api_key="unused")
    for chunk in client.completions.create(
        model="generate", prompt="Beautiful is", max_tokens=40, stop=".", stream=True
    ):
        print(chunk.choices[0].text, end="", flush=True)

Or in-process::

    async with make_service() as service:
        async for chunk in service.stream(Prompt("Errors should ")):
            print(chunk, end="", flush=True)
"""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

import microbatch
from microbatch.http import CompletionModel

__all__ = ["CharModel", "Prompt", "corpus", "make_service", "service"]

_MODULES = ("this", "json", "textwrap", "asyncio", "dataclasses", "functools", "itertools")


class Prompt(msgspec.Struct, frozen=True):
    """What to continue, how many characters to make, and how adventurous to be."""

    prompt: Annotated[str, msgspec.Meta(max_length=2000)] = ""
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=2000)] = 64
    temperature: Annotated[float, msgspec.Meta(gt=0, le=2)] = 0.7


def corpus() -> str:
    """The training text: the Zen of Python and some standard modules' docstrings."""
    import codecs
    import contextlib
    import io

    parts = []
    for name in _MODULES:
        if name == "this":  # it prints the Zen on import; its text is ROT13
            with contextlib.redirect_stdout(io.StringIO()):
                zen = importlib.import_module("this")
            parts.append(codecs.decode(zen.s, "rot13"))
        else:
            parts.append(importlib.import_module(name).__doc__ or "")
    return "\n\n".join(part.strip() for part in parts if part)


@dataclass
class _Generation:
    """One request's state in the worker."""

    hidden: Any  # torch.Tensor [hidden]
    last: int  # index of the last character made (the next step's input)
    left: int  # characters still to make
    temperature: float


class CharModel(microbatch.StepModel):
    """A GRU over characters: ``start`` reads each prompt into a hidden state,
    ``step`` makes one more character for every active request at once.

    Args:
        train_s: Seconds of training at start-up.
        hidden: Size of the GRU's hidden state.
    """

    def __init__(self, train_s: float = 5.0, hidden: int = 128) -> None:
        self.train_s = train_s
        self.hidden_size = hidden

    def setup(self, worker: microbatch.WorkerContext) -> None:
        """Train on :func:`corpus` for ``train_s`` seconds (seeded: the same weights
        for the same amount of training)."""
        import torch

        torch.manual_seed(worker.index)
        torch.set_num_threads(max(1, min(4, (os.cpu_count() or 1) // 2)))
        text = corpus()
        self.alphabet = sorted(set(text))
        self.index = {char: i for i, char in enumerate(self.alphabet)}
        self.known = frozenset(self.alphabet)
        # str.translate to one byte per character: a prompt's codes in one C call
        self.to_codes = str.maketrans({char: chr(i) for i, char in enumerate(self.alphabet)})
        size = len(self.alphabet)
        self.embed = torch.nn.Embedding(size, 32)
        self.gru = torch.nn.GRU(32, self.hidden_size, batch_first=True)
        self.out = torch.nn.Linear(self.hidden_size, size)
        self._train(torch.tensor([self.index[c] for c in text]), self.train_s)
        self.cell = torch.nn.GRUCell(32, self.hidden_size)  # the GRU's weights, one step
        self.cell.weight_ih.data = self.gru.weight_ih_l0.data
        self.cell.weight_hh.data = self.gru.weight_hh_l0.data
        self.cell.bias_ih.data = self.gru.bias_ih_l0.data
        self.cell.bias_hh.data = self.gru.bias_hh_l0.data
        self.sampler = torch.Generator().manual_seed(worker.index)
        self.no_state = torch.zeros(self.hidden_size)  # before any character (never changed)

    def _train(self, data: Any, seconds: float) -> None:
        import torch

        parameters = [*self.embed.parameters(), *self.gru.parameters(), *self.out.parameters()]
        optimiser = torch.optim.Adam(parameters, lr=0.005)
        length, batch = 64, 32
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            starts = torch.randint(0, len(data) - length - 1, (batch,))
            inputs = torch.stack([data[s : s + length] for s in starts])
            targets = torch.stack([data[s + 1 : s + length + 1] for s in starts])
            outputs, _ = self.gru(self.embed(inputs))
            loss = torch.nn.functional.cross_entropy(
                self.out(outputs).reshape(-1, len(self.alphabet)), targets.reshape(-1)
            )
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()

    def start(self, items: list[Prompt]) -> list[microbatch.Started | microbatch.ItemError]:
        """Read the prompts into their hidden states, one GRU call for the prompts
        of each length, and draw each one's first character from its last state:
        reading a prompt makes its first chunk (``Started``), so a wave of new
        requests needs no step of its own. A prompt with a character the model never
        saw fails alone."""
        import torch

        states: list[_Generation | microbatch.ItemError] = []
        by_length: dict[int, list[tuple[int, bytes]]] = {}  # -> (state index, codes)
        for item in items:
            text = "\n" + item.prompt
            if not self.known.issuperset(text):
                unknown = sorted(set(text) - self.known)
                states.append(microbatch.ItemError(f"the model never saw the characters {unknown}"))
                continue
            codes = text.translate(self.to_codes).encode("latin-1")  # a byte per character
            by_length.setdefault(len(codes), []).append((len(states), codes))
            states.append(_Generation(self.no_state, 0, item.max_tokens, item.temperature))
        generations = [state for state in states if isinstance(state, _Generation)]
        if not generations:
            return list(states)
        with torch.inference_mode():
            for length, prompts in by_length.items():
                rows = bytearray(b"".join(codes for _, codes in prompts))
                inputs = torch.frombuffer(rows, dtype=torch.uint8).view(-1, length).long()
                _, hidden = self.gru(self.embed(inputs))
                for (index, _), row in zip(prompts, hidden[0].unbind(), strict=True):
                    state = states[index]
                    assert isinstance(state, _Generation)
                    state.hidden = row
            firsts = iter(self._next(generations, torch.stack([s.hidden for s in generations])))
        return [
            state if isinstance(state, microbatch.ItemError) else self._started(state, next(firsts))
            for state in states
        ]

    def step(self, states: list[_Generation]) -> tuple[list[str], list[bool]]:
        """One character for every active request, in one batched GRU step."""
        import torch

        with torch.inference_mode():
            inputs = torch.tensor([state.last for state in states])
            hidden = self.cell(self.embed(inputs), torch.stack([s.hidden for s in states]))
            chosen = self._next(states, hidden)
        chunks, finished = [], []
        for state, code, row in zip(states, chosen, hidden.unbind(), strict=True):
            state.hidden, state.last, state.left = row, code, state.left - 1
            chunks.append(self.alphabet[code])
            finished.append(state.left == 0)
        return chunks, finished

    def _started(self, state: _Generation, code: int) -> microbatch.Started:
        state.last, state.left = code, state.left - 1
        return microbatch.Started(state, self.alphabet[code], finished=state.left == 0)

    def _next(self, states: list[_Generation], hidden: Any) -> list[int]:
        """The next character of each state, drawn from ``hidden`` (a row each) at
        its temperature."""
        import torch

        temperatures = torch.tensor([state.temperature for state in states])
        return self._draw(torch.softmax(self.out(hidden) / temperatures[:, None], dim=-1))

    def _draw(self, probabilities: Any) -> list[int]:
        """One character per row, drawn from its probabilities: a uniform number per
        row looked up in the row's running sum (ten times cheaper than
        ``torch.multinomial``, which draws from every column)."""
        import torch

        uniform = torch.rand(probabilities.shape[0], 1, generator=self.sampler)
        chosen = torch.searchsorted(probabilities.cumsum(-1), uniform)
        return chosen.clamp_(max=probabilities.shape[1] - 1)[:, 0].tolist()


def make_service(train_s: float | None = None) -> microbatch.Service[Prompt, list[str]]:
    """A new, unstarted service (``MICROBATCH_GENERATE_TRAIN_S`` sets the training
    time when ``train_s`` is not given; 5 s by default)."""
    if train_s is None:
        train_s = float(os.environ.get("MICROBATCH_GENERATE_TRAIN_S", "5"))
    service = microbatch.Service(
        microbatch.Stage(
            CharModel,
            kwargs={"train_s": train_s},
            max_batch_size=64,
            # Reading one prompt costs about a step of 64 requests (the GRU reads its
            # characters one after another): while others generate, new requests
            # wait up to 2 ms for company, and one start reads several prompts.
            min_joiners=8,
            max_join_wait_ms=2.0,
        ),
        examples=[Prompt("Beautiful is ", max_tokens=4)],
        name="generate",
    )
    # Prompt has prompt, max_tokens and temperature: the requests' own; a token is a
    # character, so usage counts the prompt's characters.
    service.completion_model = CompletionModel(count_tokens=len)  # type: ignore[attr-defined]
    return service


service = make_service()
"""What ``microbatch serve examples.generate:service`` serves."""
