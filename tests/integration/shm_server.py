"""Starts a two-worker service whose workers take a while to set up, then waits to
be killed (by the test, while the workers are still setting up)."""

from __future__ import annotations

import asyncio
import sys

from microbatch.pipeline import Service, Stage
from tests.integration.pipeline_models import SlowSetup


async def main(setup_s: float) -> None:
    async with Service(Stage(SlowSetup, workers=2, args=(setup_s,))):
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
