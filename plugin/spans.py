"""One span (trace file) turned into its `SpanAnalysis`: the one way the CLI and TensorBoard's
loading processes do it, from the analysis cache when it holds a valid entry."""

from __future__ import annotations

from . import cache, step_index
from .analysis.model import SpanAnalysis
from .reading.discovery import TraceFile


def analyze_file(f: TraceFile, shapes: bool = True, index_from_events: int = 0,
                 beside: bool = True) -> SpanAnalysis:
    """The analysis of one trace file, from the cache (`cache`) when it holds a valid entry, else read,
    analysed and cached; raises `TraceError` if it cannot be read. ``shapes=False``: op tables
    without input shapes (cheaper; for reports that do not show them). The step index is written
    beside the entry when the trace has at least ``index_from_events`` events (host and device);
    without one, a step is cut from the file when first asked for, and the index written then.
    ``beside=False``: a read-only reader's, nothing written under the logdir (`cache.places`)."""
    caching = cache.enabled()
    analysis = cache.load(f) if caching else None
    if analysis is None:
        # imported here: an analysis answered from the cache never loads the decoder
        from .analysis.nesting import nest
        from .analysis.partition import partition
        from .analysis.span import analyze_trace
        from .analysis.step_trace import StepCutter
        from .reading.decode import read_trace

        # an entry serves every reader, so what is cached keeps the input shapes
        trace = read_trace(f.path, shapes=shapes or caching)
        n = nest(trace.host)
        part = partition(trace, n)
        analysis = analyze_trace(trace, worker=f.worker, n=n, part=part)
        if caching:
            cache.store(f, analysis, beside)
            if len(trace.host) + len(trace.device) >= index_from_events:
                # from the trace decoded anyway, every step's trace cut: any step opens without reading it again
                step_index.store(f, StepCutter(trace, n, part), beside)
    return analysis


def problems_of(span: SpanAnalysis) -> str | None:
    """One line on the malformed events a readable file held, if any."""
    if not span.skipped_events:
        return None
    return span.first_problem
