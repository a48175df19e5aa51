"""microbatch: serve models with dynamic batching.

Callers send one item at a time; microbatch gathers the items that arrive close
together into batches, runs the model once per batch, and gives every caller exactly
its own result or its own error.
"""

from .batcher import Batcher
from .clock import Clock, MonotonicClock
from .config import BatchConfig
from .cooperative import CooperativeBatcher
from .decorator import AsyncBatchedFunction, BatchSettings, SyncBatchedFunction, batch
from .errors import (
    BatcherClosed,
    DeadlineExceeded,
    ItemError,
    ItemTooLarge,
    MicrobatchError,
    Overloaded,
    RemoteError,
    ResultLengthError,
    StageFailed,
    WorkerDied,
)
from .merge import ListRows, NumpyRows, RowFormat
from .pipeline import Model, Service, Stage, StepModel, WorkerContext
from .policy import AdaptivePolicy, CostModel, FixedPolicy, Policy, QueueState
from .stats import BatcherStats, ServiceStats, StageStats, StreamStats
from .step_contract import END, Started
from .streams import SlowReader, Stream
from .types import Route, Servable, StreamingServable, deadline_from

__version__ = "0.1.0"

__all__ = [
    "END",
    "AdaptivePolicy",
    "AsyncBatchedFunction",
    "BatchConfig",
    "BatchSettings",
    "Batcher",
    "BatcherClosed",
    "BatcherStats",
    "Clock",
    "CooperativeBatcher",
    "CostModel",
    "DeadlineExceeded",
    "FixedPolicy",
    "ItemError",
    "ItemTooLarge",
    "ListRows",
    "MicrobatchError",
    "Model",
    "MonotonicClock",
    "NumpyRows",
    "Overloaded",
    "Policy",
    "QueueState",
    "RemoteError",
    "ResultLengthError",
    "Route",
    "RowFormat",
    "Servable",
    "Service",
    "ServiceStats",
    "SlowReader",
    "Stage",
    "StageFailed",
    "StageStats",
    "Started",
    "StepModel",
    "Stream",
    "StreamStats",
    "StreamingServable",
    "SyncBatchedFunction",
    "WorkerContext",
    "WorkerDied",
    "batch",
    "deadline_from",
]
