"""Starts a two-worker service, prints its worker pids, then waits to be killed."""

from __future__ import annotations

import asyncio

from microbatch.pipeline import Service, Stage
from tests.integration.pipeline_models import Identity


async def main() -> None:
    async with Service(Stage(Identity, workers=2)) as service:
        print(*service.pools[0].pids, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
