"""Stages in worker processes, each batched on its own, run as one Service."""

from .model import Model, StepModel, WorkerContext
from .pool import ProcessPool
from .service import Service
from .stage import Stage

__all__ = ["Model", "ProcessPool", "Service", "Stage", "StepModel", "WorkerContext"]
