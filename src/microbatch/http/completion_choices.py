"""The streams of one completion request, read at once: each choice's text as its
chunks come, cut before its first stop sequence (:mod:`.stop_text`), merged into one
sequence of :class:`Piece` s. A choice that stops, or goes past ``max_tokens``,
leaves its stream at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..streams import stop_reading
from .stop_text import StopText

__all__ = ["Choices", "Piece"]

_QUEUED_PIECES = 64  # pieces read ahead of a slow client, for all of a request's choices


@dataclass(frozen=True)
class Piece:
    """Text of one choice; its last piece also says why the choice ended and how
    many chunks it took."""

    index: int
    text: str
    finish_reason: str | None = None
    chunks: int = 0


class Choices:
    """The streams of one request, read at once: each choice's text as its chunks
    come, cut before its first stop sequence, merged into one sequence of pieces."""

    def __init__(self, streams: list[AsyncIterator[Any]], chunk_text: Callable[[Any], str]) -> None:
        self._streams = streams
        self._chunk_text = chunk_text
        self._tasks: list[asyncio.Task[None]] = []
        self._queue: asyncio.Queue[Piece | Exception] = asyncio.Queue(_QUEUED_PIECES)

    async def pieces(self, stops: Sequence[str], max_tokens: int | None) -> AsyncIterator[Piece]:
        """Every choice's pieces as they come, each choice's last with its
        ``finish_reason``.

        Raises:
            Exception: The first error of any choice (the others are left).
        """
        if len(self._streams) == 1:  # the usual request: read in this task, no queue
            async for piece in self._choice(0, self._streams[0], StopText(stops), max_tokens):
                yield piece
            return
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._read(index, stream, StopText(stops), max_tokens))
            for index, stream in enumerate(self._streams)
        ]
        going = len(self._tasks)
        while going:
            came = await self._queue.get()
            if isinstance(came, Exception):
                raise came
            if came.finish_reason is not None:
                going -= 1
            yield came

    @property
    def streams(self) -> list[AsyncIterator[Any]]:
        """The streams, one per choice, in the order of their index."""
        return self._streams

    async def close(self) -> None:
        """Leave every stream still read."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for stream in self._streams:
            await stop_reading(stream)

    async def _read(
        self, index: int, stream: AsyncIterator[Any], text: StopText, max_tokens: int | None
    ) -> None:
        """One choice's pieces (or its error) into the queue of every choice."""
        try:
            async for piece in self._choice(index, stream, text, max_tokens):
                await self._queue.put(piece)
        except Exception as error:
            await self._queue.put(error)

    async def _choice(
        self, index: int, stream: AsyncIterator[Any], text: StopText, max_tokens: int | None
    ) -> AsyncIterator[Piece]:
        """One choice's pieces as its chunks come, the last with its ``finish_reason``."""
        chunks, last = 0, ""
        try:
            async for chunk in stream:
                if chunks == max_tokens:  # the model goes on past max_tokens: leave it
                    break
                chunks += 1
                last = text.feed(self._chunk_text(chunk))
                if text.stopped:
                    break
                if last:
                    yield Piece(index, last)
                    last = ""
        finally:
            await stop_reading(stream)  # at once: its slot is freed at the next step
        # "length": max_tokens was reached, or the model ended where only it knows
        # (no max_tokens asked); "stop": a stop sequence, or the model ended by itself
        # before max_tokens
        ended_early = max_tokens is not None and chunks < max_tokens
        reason = "stop" if text.stopped or ended_early else "length"
        yield Piece(index, last + text.flush(), reason, chunks)
