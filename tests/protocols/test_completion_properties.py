"""OpenAI completions under concurrency, as a property: random sets of requests
sent at once to one app (prompts that may fail part-way, several prompts and
choices, stop sequences, ``max_tokens``, streamed or not, completions or chat)
each get exactly their own texts, or their own error, and nothing else: through
the ASGI app, and through ``microbatch serve``'s connection layer (which opens and
writes the streamed answers itself, and hands the others to the ASGI app).

The model (:class:`~tests.protocols.models.Speller`) spells each prompt back a
character a step, round and round, and fails an item whose turn comes to a ``!``,
so what each choice must get is known in advance."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch
from microbatch.http import CompletionModel, HttpApp
from microbatch.http.completion_requests import ChatMessage
from microbatch.http.completions import plain_chat_template
from tests.http.conftest import serving, serving_natively

from .models import Speller

HANG_GUARD_S = 60.0


@dataclass(frozen=True)
class Ask:
    """One request: its prompts, choices each, bounds, and how it is answered."""

    prompts: list[str]
    n: int
    max_tokens: int
    stops: list[str]
    stream: bool
    chat: bool

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "spell",
            "max_tokens": self.max_tokens,
            "n": self.n,
            "stream": self.stream,
        }
        if self.stops:
            body["stop"] = self.stops
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.prompts[0]}]
        else:
            body["prompt"] = self.prompts if len(self.prompts) > 1 else self.prompts[0]
        return body

    def expected(self) -> list[tuple[str, str] | None]:
        """Each choice's (text, finish_reason), or None where it fails."""
        prompts = self.prompts
        if self.chat:
            prompts = [plain_chat_template([ChatMessage("user", self.prompts[0])])]
        return [self._choice(prompt) for prompt in prompts for _ in range(self.n)]

    def _choice(self, prompt: str) -> tuple[str, str] | None:
        spelled = (prompt * self.max_tokens)[: self.max_tokens]
        ends = [(at + len(stop), at) for stop in self.stops if (at := spelled.find(stop)) >= 0]
        stop_end, stop_at = min(ends) if ends else (len(spelled) + 1, len(spelled))
        failing = spelled.find("!")
        if 0 <= failing < stop_end:  # its turn comes before a stop is complete
            return None
        return spelled[:stop_at], "stop" if ends else "length"


texts = st.text(alphabet="ab!", min_size=1, max_size=4)
asks = st.builds(
    Ask,
    prompts=st.lists(texts, min_size=1, max_size=2),
    n=st.integers(1, 2),
    max_tokens=st.integers(1, 8),
    stops=st.lists(st.text(alphabet="ab", min_size=1, max_size=3), max_size=3),
    stream=st.booleans(),
    chat=st.booleans(),
)


def _answered(ask: Ask, reply: httpx.Response) -> tuple[list[tuple[str, str | None]], bool]:
    """Each choice's (text, finish_reason) as answered, and whether the answer ended
    with an error (an error status, or a streamed answer's error event)."""
    count = len(ask.expected())
    got: list[tuple[str, str | None]] = [("", None)] * count
    if reply.status_code != 200:
        assert reply.status_code == 422, reply.text  # the item's error, before any text
        assert "spelled a '!'" in reply.json()["error"]["message"]
        return got, True
    if not ask.stream:
        for choice in reply.json()["choices"]:
            text = choice["message"]["content"] if ask.chat else choice["text"]
            got[choice["index"]] = (text, choice["finish_reason"])
        return got, False
    events = [line.removeprefix("data: ") for line in reply.text.split("\n\n") if line]
    failed = events[-1] != "[DONE]"
    for event in events[:-1]:
        decoded = json.loads(event)
        if "error" in decoded:
            assert "spelled a '!'" in decoded["error"]["message"]
            continue
        for choice in decoded["choices"]:
            text, reason = got[choice["index"]]
            assert reason is None  # nothing after a choice's end
            piece = choice["delta"].get("content", "") if ask.chat else choice["text"]
            got[choice["index"]] = (text + piece, choice["finish_reason"])
    return got, failed


@pytest.mark.parametrize("served", [serving, serving_natively], ids=["asgi", "connection"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(asks, min_size=1, max_size=6))
def test_every_request_gets_exactly_its_own_texts_or_its_own_error(
    served: Any, sent: list[Ask]
) -> None:
    service = microbatch.Service(
        microbatch.Stage(Speller, mode="thread", max_batch_size=4), name="spell"
    )
    service.completion_model = CompletionModel()  # type: ignore[attr-defined]

    async def send_all() -> list[httpx.Response]:
        async with served(HttpApp(service)) as client:
            posts = [
                client.post(
                    "/v1/chat/completions" if ask.chat else "/v1/completions", json=ask.body()
                )
                for ask in sent
            ]
            return await asyncio.wait_for(asyncio.gather(*posts), HANG_GUARD_S)

    for ask, reply in zip(sent, asyncio.run(send_all()), strict=True):
        expected = ask.expected()
        got, failed = _answered(ask, reply)
        assert failed == (None in expected), (ask, reply.text)
        for want, (text, reason) in zip(expected, got, strict=True):
            if failed:  # what came is where its choice was going, and no choice ended wrong
                assert want is None or want[0].startswith(text) or reason is None
                continue
            assert want == (text, reason), (ask, reply.text)
