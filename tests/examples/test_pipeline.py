"""The three-stage language pipeline: starts, identifies languages, shuts down."""

from __future__ import annotations

import asyncio

import pytest

from examples.pipeline import LanguageGuess, LanguageRequest, make_service
from microbatch.errors import RemoteError

pytestmark = pytest.mark.timeout(120)

SENTENCES = {
    "Good morning, how are you doing?": "en",
    "Bonjour, comment allez-vous ?": "fr",
    "Guten Morgen, wie geht es Ihnen?": "de",
    "Buenos días, ¿cómo está usted?": "es",
    "The cat is sleeping on the sofa.": "en",
    "Le chat dort sur le canapé.": "fr",
    "Die Katze schläft auf dem Sofa.": "de",
    "El gato duerme en el sofá.": "es",
}


async def test_identifies_languages_through_three_stages() -> None:
    service = make_service()
    assert [stage.workers for stage in service.stages] == [2, 1, 1]
    async with service:
        assert service.ready
        answers = await asyncio.gather(
            *(service.submit(LanguageRequest(text), timeout_s=30) for text in SENTENCES)
        )
        stats = service.stats()
    assert all(isinstance(a, LanguageGuess) for a in answers)
    assert [a.language for a in answers] == list(SENTENCES.values())
    assert all(0.25 < a.probability <= 1.0 for a in answers)
    items = [s.batching.items for s in stats.stages]
    assert items[0] == items[1] == items[2] >= len(SENTENCES)  # every item ran every stage
    assert not service.ready


async def test_a_text_without_letters_fails_alone_in_the_first_stage() -> None:
    async with make_service() as service:
        outcomes = await asyncio.gather(
            service.submit(LanguageRequest("1234 !!")),
            service.submit(LanguageRequest("Le chat dort sur le canapé.")),
            return_exceptions=True,
        )
        stats = service.stats()
    assert isinstance(outcomes[0], RemoteError) and outcomes[0].type_name == "ValueError"
    assert outcomes[1] == LanguageGuess("fr", outcomes[1].probability)  # type: ignore[union-attr]
    first, second, third = (s.batching.items for s in stats.stages)
    assert third == second == first - 1  # the bad text never reached the later stages
