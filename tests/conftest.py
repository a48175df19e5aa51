"""Shared helpers for the test suite."""

from __future__ import annotations

import asyncio


async def settle(rounds: int = 20) -> None:
    """Let every ready task and callback run (no time passes on a FakeClock)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
