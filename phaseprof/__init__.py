"""phaseprof: per-step data / forward / backward / optimizer phase profiling for PyTorch.

``from phaseprof import PhaseProfiler`` (training side, needs torch), ``from phaseprof import
Analysis`` (every analysis of a logdir, typed: `phaseprof.plugin.facade`) and ``from phaseprof
import analyze`` (the whole report as plain data; both read traces, no torch) are resolved
lazily, so that ``import phaseprof.plugin`` — what TensorBoard does at start-up — never imports
torch.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Analysis", "PhaseProfiler", "analyze"]


def __getattr__(name: str):
    if name == "PhaseProfiler":
        from .training_hooks.profiler import PhaseProfiler

        return PhaseProfiler
    if name == "Analysis":
        from .plugin.facade import Analysis

        return Analysis
    if name == "analyze":
        from .cli.report import analyze

        return analyze
    raise AttributeError(f"module 'phaseprof' has no attribute {name!r}")
