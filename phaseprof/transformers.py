"""``from phaseprof.transformers import PhaseProfilerCallback``: PhaseProfiler as a callback of the
Hugging Face ``transformers`` Trainer (``pip install 'phaseprof[transformers]'``). Imports
transformers and torch only when the name is used."""

from __future__ import annotations


def __getattr__(name: str):
    if name == "PhaseProfilerCallback":
        from .training_hooks.integrations.transformers import PhaseProfilerCallback

        return PhaseProfilerCallback
    raise AttributeError(f"module 'phaseprof.transformers' has no attribute {name!r}")
