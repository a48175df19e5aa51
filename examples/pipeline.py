"""A three-stage pipeline: which language is a text in (English, French, German, Spanish)?

``normalize`` (2 workers, batches of up to 256) → ``featurize`` (1 worker, batches of
up to 128: hashed character n-grams) → ``score`` (1 worker, batches of up to 64: a
linear model, one sparse matrix product per batch). Each stage batches on its own;
the stages differ in workers and batch size to show how a pipeline is put together.
The scorer is trained at start-up on the short sentences in :data:`TRAINING`, put
through the very same normalize and featurize code, so the example needs no download.

Run in-process::

    async with service:
        guess = await service.submit(LanguageRequest("Le chat dort sur le canapé."))  # fr
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

import microbatch

__all__ = [
    "Featurize",
    "LanguageGuess",
    "LanguageRequest",
    "Normalize",
    "Score",
    "SparseFeatures",
    "featurize",
    "make_service",
    "normalize",
    "service",
]

N_FEATURES = 2**16

TRAINING: dict[str, list[str]] = {
    "en": [
        "the weather is nice today and we are going to the park",
        "where is the train station please",
        "I would like a cup of coffee with milk",
        "they have been working on this project for three years",
        "the children played in the garden until it was dark",
        "can you tell me what time it is",
        "this is the best book I have ever read",
        "we should leave early because the roads will be busy",
        "my brother lives in a small house near the river",
        "thank you very much for your help yesterday",
        "what would you like to eat for dinner tonight",
        "the meeting has been moved to thursday afternoon",
        "I am looking for my keys and my phone",
        "she said that he would come back in an hour",
        "there is a new shop on the corner of the street",
        "do you know where I can find a doctor",
        "it was a long and difficult day at work",
        "he wants to learn how to play the guitar",
        "our friends are coming to visit us next week",
        "the food in this restaurant is very good",
    ],
    "fr": [
        "il fait beau aujourd'hui et nous allons au parc",
        "où est la gare s'il vous plaît",
        "je voudrais une tasse de café au lait",
        "ils travaillent sur ce projet depuis trois ans",
        "les enfants ont joué dans le jardin jusqu'à la nuit",
        "pouvez-vous me dire quelle heure il est",
        "c'est le meilleur livre que j'aie jamais lu",
        "nous devrions partir tôt parce que les routes seront chargées",
        "mon frère habite dans une petite maison près de la rivière",
        "merci beaucoup pour votre aide d'hier",
        "qu'est-ce que tu veux manger ce soir",
        "la réunion a été déplacée à jeudi après-midi",
        "je cherche mes clés et mon téléphone",
        "elle a dit qu'il reviendrait dans une heure",
        "il y a un nouveau magasin au coin de la rue",
        "savez-vous où je peux trouver un médecin",
        "c'était une journée longue et difficile au travail",
        "il veut apprendre à jouer de la guitare",
        "nos amis viennent nous voir la semaine prochaine",
        "la cuisine de ce restaurant est très bonne",
    ],
    "de": [
        "das wetter ist heute schön und wir gehen in den park",
        "wo ist bitte der bahnhof",
        "ich hätte gern eine tasse kaffee mit milch",
        "sie arbeiten seit drei jahren an diesem projekt",
        "die kinder spielten im garten bis es dunkel war",
        "können sie mir sagen wie spät es ist",
        "das ist das beste buch das ich je gelesen habe",
        "wir sollten früh losfahren weil die straßen voll sein werden",
        "mein bruder wohnt in einem kleinen haus am fluss",
        "vielen dank für ihre hilfe gestern",
        "was möchtest du heute abend essen",
        "die besprechung wurde auf donnerstag nachmittag verschoben",
        "ich suche meine schlüssel und mein telefon",
        "sie sagte dass er in einer stunde zurückkommt",
        "an der ecke der straße gibt es einen neuen laden",
        "wissen sie wo ich einen arzt finden kann",
        "es war ein langer und schwieriger tag bei der arbeit",
        "er will lernen wie man gitarre spielt",
        "unsere freunde besuchen uns nächste woche",
        "das essen in diesem restaurant ist sehr gut",
    ],
    "es": [
        "hoy hace buen tiempo y vamos al parque",
        "dónde está la estación de tren por favor",
        "quisiera una taza de café con leche",
        "llevan tres años trabajando en este proyecto",
        "los niños jugaron en el jardín hasta que oscureció",
        "puede decirme qué hora es",
        "este es el mejor libro que he leído nunca",
        "deberíamos salir temprano porque las carreteras estarán llenas",
        "mi hermano vive en una casa pequeña cerca del río",
        "muchas gracias por tu ayuda de ayer",
        "qué quieres cenar esta noche",
        "la reunión se ha cambiado al jueves por la tarde",
        "estoy buscando mis llaves y mi teléfono",
        "ella dijo que él volvería en una hora",
        "hay una tienda nueva en la esquina de la calle",
        "sabe dónde puedo encontrar un médico",
        "fue un día largo y difícil en el trabajo",
        "él quiere aprender a tocar la guitarra",
        "nuestros amigos vienen a visitarnos la semana que viene",
        "la comida de este restaurante es muy buena",
    ],
}

_NOT_LETTERS = re.compile(r"[\W\d_]+")


class LanguageRequest(msgspec.Struct, frozen=True):
    """A text to identify."""

    text: str


class LanguageGuess(msgspec.Struct, frozen=True):
    """The most likely language (ISO 639-1 code) and the model's probability for it."""

    language: str
    probability: float


@dataclass(frozen=True)
class SparseFeatures:
    """One text's non-zero hashed n-gram features (sent from featurize to score)."""

    indices: np.ndarray[Any, np.dtype[np.int32]]
    values: np.ndarray[Any, np.dtype[np.float32]]


def normalize(text: str) -> str:
    """NFKC, case-folded, letters only, single spaces.

    Raises:
        ValueError: Nothing is left (the text has no letters).
    """
    words = _NOT_LETTERS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).split()
    if not words:
        raise ValueError(f"no letters to identify a language from in {text!r}")
    return " ".join(words)


def featurize(texts: list[str]) -> list[SparseFeatures]:
    """Hashed character 1- to 3-grams within word boundaries, L2-normalized."""
    from sklearn.feature_extraction.text import HashingVectorizer

    vectorizer = HashingVectorizer(
        analyzer="char_wb", ngram_range=(1, 3), n_features=N_FEATURES, alternate_sign=False
    )
    matrix = vectorizer.transform(texts).tocsr()
    return [
        SparseFeatures(
            matrix.indices[start:end].astype(np.int32),
            matrix.data[start:end].astype(np.float32),
        )
        for start, end in zip(matrix.indptr[:-1], matrix.indptr[1:], strict=True)
    ]


class Normalize(microbatch.Model):
    """Stage 1: clean the text; a text without letters fails alone."""

    def predict(self, batch: list[LanguageRequest]) -> list[str | ValueError]:
        """Normalize each request's text."""
        out: list[str | ValueError] = []
        for request in batch:
            try:
                out.append(normalize(request.text))
            except ValueError as exc:
                out.append(exc)
        return out


class Featurize(microbatch.Model):
    """Stage 2: hashed character n-grams, one vectorizer call per batch."""

    def predict(self, batch: list[str]) -> list[SparseFeatures]:
        """Featurize a batch of normalized texts."""
        return featurize(batch)


class Score(microbatch.Model):
    """Stage 3: a linear model trained at start-up on :data:`TRAINING`."""

    def setup(self, worker: microbatch.WorkerContext) -> None:
        """Fit logistic regression on the training sentences; keep its weights."""
        from sklearn.linear_model import LogisticRegression

        labels = [language for language, texts in TRAINING.items() for _ in texts]
        texts = [normalize(text) for texts in TRAINING.values() for text in texts]
        fit = LogisticRegression(C=100.0, max_iter=1000).fit(_matrix(featurize(texts)), labels)
        self.languages = [str(c) for c in fit.classes_]
        self.weights = fit.coef_.T.astype(np.float32)  # (features, languages)
        self.bias = fit.intercept_.astype(np.float32)

    def predict(self, batch: list[SparseFeatures]) -> list[LanguageGuess]:
        """Score a batch with one sparse-dense product and a softmax."""
        logits = _matrix(batch) @ self.weights + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        probabilities = np.exp(logits)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        best = probabilities.argmax(axis=1)
        return [
            LanguageGuess(self.languages[int(b)], float(p[b]))
            for b, p in zip(best, probabilities, strict=True)
        ]


def _matrix(rows: list[SparseFeatures]) -> Any:
    """Stack per-text features into one CSR matrix (texts x features)."""
    from scipy.sparse import csr_matrix

    indptr = np.cumsum([0, *(len(r.indices) for r in rows)])
    indices = np.concatenate([r.indices for r in rows])
    values = np.concatenate([r.values for r in rows])
    return csr_matrix((values, indices, indptr), shape=(len(rows), N_FEATURES))


def make_service() -> microbatch.Service:
    """A new, unstarted service (a Service runs once: start, serve, close)."""
    return microbatch.Service(
        microbatch.Stage(
            Normalize,
            workers=2,
            batching=microbatch.BatchConfig(max_batch_size=256, max_latency_ms=2),
        ),
        microbatch.Stage(
            Featurize,
            workers=1,
            batching=microbatch.BatchConfig(max_batch_size=128, max_latency_ms=5),
        ),
        microbatch.Stage(
            Score,
            workers=1,
            batching=microbatch.BatchConfig(max_batch_size=64, max_latency_ms=5),
        ),
        examples=[
            LanguageRequest("The weather is lovely."),
            LanguageRequest("Il fait très beau."),
            LanguageRequest("Das Wetter ist schön."),
            LanguageRequest("Hace muy buen tiempo."),
        ],
    )


service = make_service()
