"""The generative example: a character model trained at start-up streams its text
step-wise, in-process and from ``microbatch serve``."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from examples.generate import Prompt, corpus, make_service
from microbatch import ItemError, Started
from tests.serve.test_server import running

pytestmark = pytest.mark.timeout(180)


def test_the_corpus_is_there_offline() -> None:
    text = corpus()
    assert "Beautiful is better than ugly." in text
    assert len(text) > 2000


async def test_streams_one_character_per_step_and_fails_bad_prompts_alone() -> None:
    async with make_service(train_s=0.5) as service:
        lengths = [3, 40, 7, 1]
        texts = await asyncio.gather(
            *(service.submit(Prompt("Beautiful ", max_tokens=n)) for n in lengths),
            service.submit(Prompt("日本")),
            return_exceptions=True,
        )
        streamed = [chunk async for chunk in service.stream(Prompt("Now ", max_tokens=5))]
        stats = service.stats().stages[0].streams
    assert [len(text) for text in texts[:4]] == lengths  # type: ignore[arg-type]
    assert all(len(chunk) == 1 for text in texts[:4] for chunk in text)  # type: ignore[union-attr]
    assert isinstance(texts[4], ItemError) and "never saw" in str(texts[4])
    assert len(streamed) == 5
    assert stats is not None and stats.completed >= 5 and stats.failed >= 1


def test_served_with_microbatch_serve() -> None:
    env = {"MICROBATCH_GENERATE_TRAIN_S": "0.5"}
    with (
        running("examples.generate:service", "--log-level", "warning", env=env) as server,
        httpx.Client(base_url=server.url, timeout=120) as client,
    ):
        body = {"prompt": "Errors should ", "max_tokens": 12}
        headers = {"accept": "application/x-ndjson"}
        with client.stream("POST", "/stream", json=body, headers=headers) as reply:
            messages = [json.loads(line) for line in reply.iter_lines() if line]
        assert len(messages) == 13
        assert all(len(message["chunk"]) == 1 for message in messages[:12])
        assert messages[-1] == {"end": {"status": "complete", "chunks": 12}}
        invalid = client.post("/stream", json={"prompt": "x", "max_tokens": 0})
        assert invalid.status_code == 422
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0) as llm:
            streamed = llm.completions.create(
                model="generate", prompt="Errors should ", max_tokens=9, stream=True
            )
            texts = [chunk.choices[0].text for chunk in streamed]
            assert len("".join(texts)) == 9 and texts[-1] == ""
            chat = llm.chat.completions.create(
                model="generate", messages=[{"role": "user", "content": "Now"}], max_tokens=5
            )
            assert len(chat.choices[0].message.content or "") == 5
            assert chat.usage is not None and chat.usage.prompt_tokens == len(
                "user: Now\nassistant:"
            )
            with pytest.raises(openai.BadRequestError, match="max_tokens"):
                llm.completions.create(model="generate", prompt="x", max_tokens=2001)


def test_start_reads_each_prompt_as_the_gru_cell_would_and_makes_its_first_character() -> None:
    import torch

    from examples.generate import CharModel
    from microbatch import WorkerContext

    model = CharModel(train_s=0.05)
    model.setup(WorkerContext("generate", 0))
    prompts = ["Beautiful is ", "ab", "", "Errors should", "x日"]
    started = model.start([Prompt(text, max_tokens=2) for text in prompts])
    assert isinstance(started[-1], ItemError) and "'日'" in str(started[-1])
    for text, first in zip(prompts[:-1], started, strict=False):
        assert isinstance(first, Started) and not first.finished
        hidden = torch.zeros(model.hidden_size)
        with torch.inference_mode():
            for char in "\n" + text:
                code = torch.tensor([model.index[char]])
                hidden = model.cell(model.embed(code), hidden[None])[0]
        state = first.state
        assert torch.allclose(state.hidden, hidden, atol=1e-5), text
        assert first.chunk in model.alphabet and state.last == model.index[first.chunk]
        assert state.left == 1  # the first of its two characters is made
    (single,) = model.start([Prompt("ab", max_tokens=1)])
    assert isinstance(single, Started) and single.finished


def test_characters_are_drawn_with_their_probabilities() -> None:
    import torch

    from examples.generate import CharModel
    from microbatch import WorkerContext

    model = CharModel(train_s=0.0)
    model.setup(WorkerContext("generate", 0))
    certain = torch.eye(5)  # row i: character i for sure
    assert model._draw(certain) == [0, 1, 2, 3, 4]
    rows = torch.tensor([[0.2, 0.0, 0.8]]).expand(20_000, 3)
    drawn = torch.tensor(model._draw(rows))
    assert set(drawn.tolist()) == {0, 2}  # never a character of probability 0
    share = (drawn == 2).float().mean().item()
    assert 0.78 < share < 0.82  # 0.8 within about seven standard deviations
