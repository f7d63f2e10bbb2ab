"""``from phaseprof.lightning import PhaseProfilerCallback``: PhaseProfiler as a Lightning callback
(``lightning`` or ``pytorch_lightning``; ``pip install 'phaseprof[lightning]'``). Imports Lightning
and torch only when the name is used."""

from __future__ import annotations


def __getattr__(name: str):
    if name == "PhaseProfilerCallback":
        from .training_hooks.integrations.lightning import PhaseProfilerCallback

        return PhaseProfilerCallback
    raise AttributeError(f"module 'phaseprof.lightning' has no attribute {name!r}")
