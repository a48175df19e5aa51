"""``microbatch tune``: measure a service's models, advise batching settings.

:mod:`.advice` holds the arithmetic (pure), :mod:`.measure` the in-process timing,
:mod:`.report` the text, JSON and plot, and the command line is :mod:`microbatch.cli._tune`.
"""

from .advice import Advice, Measurement, StageAdvice, StageCurve, knee, recommend
from .measure import TuneError, batch_sizes, load_service, measure_model, measure_service
from .report import PlotUnavailable, plot, to_json, to_text

__all__ = [
    "Advice",
    "Measurement",
    "PlotUnavailable",
    "StageAdvice",
    "StageCurve",
    "TuneError",
    "batch_sizes",
    "knee",
    "load_service",
    "measure_model",
    "measure_service",
    "plot",
    "recommend",
    "to_json",
    "to_text",
]
