"""The Step Phases tab's backend: TensorBoard plugin routes over the trace store and the scalars.

Each route is a ``_serve_<route>`` handler that parses the request and responds (through
``http_util.Respond``, which sets content type, nosniff and the security policy) over a
``<route>_impl`` that returns an answer Struct (`phaseprof.plugin.answers`) or raises TensorBoard's
typed errors (404 `errors.NotFoundError`, 400 `errors.InvalidArgumentError`), as TensorBoard's own
plugins do. One resolver, `_resolve`, turns ``run`` / ``worker`` / ``step`` parameters into what was
discovered under the logdir (they are never used to build a path); it also rescans the logdir, so
every route starts the loading it needs. The routes are documented in ``plugin/http_api.md``.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import msgspec
import numpy as np
from tensorboard import context as tb_context
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from phaseprof.contract import PHASE_REGISTRY, SCALAR_PREFIX, USER_PHASE_COLOURS

from ..analysis.collectives import collectives_answer
from ..analysis.compare import compare
from ..analysis.kernels import kernels_answer
from ..analysis.memory import memory_series
from ..analysis.memory_ops import memory_devices, run_memory
from ..analysis.modules import modules_answer
from ..analysis.operators import GROUPS, run_ops
from ..analysis.ranks import ranks
from ..analysis.steps import apart_bands, ms, step_detail, step_rows
from ..analysis.timeline import timeline
from ..analysis.whole_run import scalars_of, whole_run
from ..analysis.worker import Worker, phase_names, rank_of, rank_order
from ..analysis.worker_summary import summarize
from ..answers import (
    CollectivesAnswer,
    CompareAnswer,
    FileError,
    KernelsAnswer,
    MemoryAnswer,
    MemoryEventsAnswer,
    ModulesAnswer,
    OpsAnswer,
    PhaseStyle,
    RanksAnswer,
    RunInfo,
    RunsAnswer,
    SpanInfo,
    StepDetail,
    StepsAnswer,
    TimelineAnswer,
    WorkerInfo,
)
from ..reading import storage
from ..reading.decode import TraceError
from ..reading.discovery import Run
from .capture import ASK_HEADER, capture_impl, read_only
from .origin import Served
from .store import LOADING, PENDING, READY, TraceStore

PLUGIN_NAME = "phaseprof"
_STATIC_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "static")
_CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".map": "application/json",
                  ".svg": "image/svg+xml", ".png": "image/png", ".woff2": "font/woff2", ".txt": "text/plain"}
#: Scalars per tag asked of the data provider: all it kept (TensorBoard keeps 1,000 by default).
_ALL_SAMPLES = 10**9
#: An integer parameter: ASCII digits with an optional leading minus, nothing else.
_INTEGER = re.compile(r"-?[0-9]+")
#: Step numbers are 64-bit: an integer parameter of more digits names nothing (and Python's int()
#: refuses more than 4,300 of them).
_MAX_DIGITS = 19


class Target(NamedTuple):
    """What a request's ``run`` / ``worker`` / ``step`` parameters name."""

    run: Run
    worker: Worker | None = None
    step: int | None = None  # the step number asked for
    rows: list[int] | None = None  # the worker's rows of that step


class PhaseprofPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        self._data_provider = context.data_provider
        self._read_only = read_only(context.flags)
        self._store = TraceStore(context.logdir or "", read_only=self._read_only is not None)
        self._static = _static_files()
        self._served = Served(context.flags)  # the Host and Origin a POST /capture must carry
        #: (run, rank) -> (the rank's phase scalars, its figures over every timed step) (`ranks_impl`)
        self._whole_runs: dict[tuple[str, int], tuple[object, object]] = {}
        self._store.refresh_soon(force=True)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Step Phases")

    def is_active(self) -> bool:
        """From the cached scan; a rescan runs in the background when it is due. A logdir that cannot
        be listed is active too: the tab says why it shows nothing."""
        self._store.refresh_soon()
        return (self._store.has_traces() or self._store.logdir_error() is not None
                or self._has_phase_scalars())

    def get_plugin_apps(self) -> dict:
        return {
            "/index.js": self._serve_index,
            "/static/*": self._serve_static,
            "/runs": self._serve_runs,
            "/steps": self._serve_steps,
            "/step": self._serve_step,
            "/timeline": self._serve_timeline,
            "/compare": self._serve_compare,
            "/ranks": self._serve_ranks,
            "/trace": self._serve_trace,
            "/kernels": self._serve_kernels,
            "/modules": self._serve_modules,
            "/ops": self._serve_ops,
            "/memory": self._serve_memory,
            "/capture": self._serve_capture,
            "/collectives": self._serve_collectives,
            "/memory_events": self._serve_memory_events,
        }

    # --- static files -----------------------------------------------------------------------------

    @wrappers.Request.application
    def _serve_index(self, request):
        return self._static_response(request, "index.js")

    @wrappers.Request.application
    def _serve_static(self, request):
        name = request.path.rsplit("/static/", 1)[-1]
        return self._static_response(request, name)

    def _static_response(self, request, name: str):
        path = self._static.get(name)
        if path is None:
            raise errors.NotFoundError(f"no static file {name!r}")
        with open(path, "rb") as fh:
            body = fh.read()
        content_type = _CONTENT_TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
        return http_util.Respond(request, body, content_type)

    # --- data routes ------------------------------------------------------------------------------

    @wrappers.Request.application
    def _serve_runs(self, request):
        self._store.refresh()
        return _json(request, self.runs_impl())

    def runs_impl(self) -> RunsAnswer:
        out, problems = [], []
        for run in self._store.runs():
            workers = []
            for worker, files in run.workers.items():
                spans = [self._store.span(f) for f in files]
                problems += [FileError(path=os.path.join(run.name, s.file.name), error=s.error)
                             for s in spans if s.error]
                workers.append(WorkerInfo(
                    worker=worker,
                    rank=rank_of(worker, [s.analysis for s in spans if s.analysis is not None]),
                    state=LOADING if any(s.state in (PENDING, LOADING) for s in spans) else READY,
                    spans=[SpanInfo(file=s.file.name, size=s.file.size, state=s.state,
                                    steps=len(s.analysis.steps) if s.analysis else None, error=s.error,
                                    gpu=s.analysis.has_gpu if s.analysis else None)
                           for s in spans],
                ))
            out.append(RunInfo(run=run.name, has_scalars=bool(run.scalar_dirs()), workers=workers))
        problems += [FileError(path=path, error=why) for path, why in self._store.unreadable()]
        return RunsAnswer(runs=out, loading=self._store.progress(), errors=problems,
                          phases=[PhaseStyle(name=p.name, colour=p.colour) for p in PHASE_REGISTRY],
                          user_phase_colours=list(USER_PHASE_COLOURS), logdir_error=self._store.logdir_error())

    @wrappers.Request.application
    def _serve_steps(self, request):
        return _json(request, self.steps_impl(self._resolve(request.args, worker=True)))

    def steps_impl(self, target: Target) -> StepsAnswer:
        run, w = target.run, target.worker
        return StepsAnswer(
            run=run.name,
            worker=w.name,
            workers=list(run.workers),
            phases=w.phases,
            gpu=w.has_gpu,
            steps=self._store.derived(run, w.name, step_rows),
            summary=self._store.derived(run, w.name, summarize),
        )

    @wrappers.Request.application
    def _serve_step(self, request):
        return _json(request, self.step_impl(self._resolve(request.args, worker=True, step="required")))

    def step_impl(self, target: Target) -> StepDetail:
        return step_detail(target.worker, target.rows[0], target.run.name)

    @wrappers.Request.application
    def _serve_timeline(self, request):
        return _json(request, self.timeline_impl(request.environ, self._resolve(request.args)))

    def timeline_impl(self, environ, target: Target) -> TimelineAnswer:
        run = target.run
        series = {}
        for _, directory in run.scalar_dirs():  # the run's own scalars, else its lowest rank's
            series = self._phase_scalars(environ, [self._tb_run(directory)]).get(self._tb_run(directory), {})
            if series:
                break
        if not series:
            raise errors.NotFoundError(f"run {run.name!r} has no phaseprof scalars (yet)")
        dense = max(series.values(), key=len)
        kept_all = not dense or len(dense) >= dense[-1][0] - dense[0][0] + 1
        profiled = []
        for name in run.workers:
            w = self._store.worker(run, name)
            profiled += [w.numbers[k] for k in w.full().tolist()]
        return timeline(run.name, series, profiled, kept_all)

    @wrappers.Request.application
    def _serve_compare(self, request):
        a = self._resolve(request.args, worker=True, step="optional", side="a")
        b = self._resolve(request.args, worker=True, step="optional", side="b")
        by = request.args.get("device") or "cpu"
        if by not in ("cpu", "gpu"):
            raise errors.InvalidArgumentError(f"device must be cpu or gpu, not {by!r}")
        return _json(request, self.compare_impl(a, b, request.args.get("op") or None, by))

    def compare_impl(self, a: Target, b: Target, op: str | None = None, device: str = "cpu") -> CompareAnswer:
        phases = phase_names(a.worker.spans + b.worker.spans)
        return compare(_side(a), _side(b), phases, labels=(_label(a), _label(b)), op=op,
                       by="gpu" if device == "gpu" else "both")

    @wrappers.Request.application
    def _serve_ranks(self, request):
        return _json(request, self.ranks_impl(request.environ, self._resolve(request.args)))

    def ranks_impl(self, environ, target: Target) -> RanksAnswer:
        """The ranks side by side (made once per change of the run's spans: `TraceStore.of_run`), with
        each rank's figures over every timed step (made again only when its scalars changed)."""
        run = target.run
        answer = self._store.of_run(run, ranks)
        dirs = run.rank_scalars
        if not dirs:
            return answer
        series = self._phase_scalars(environ, [self._tb_run(d) for d in dirs.values()])
        figures = []
        for rank, directory in sorted(dirs.items()):
            points = series.get(self._tb_run(directory))
            key = (run.name, rank)
            kept = self._whole_runs.get(key)
            if kept is None or kept[0] != points:
                kept = self._whole_runs[key] = (points, whole_run(scalars_of(points), rank) if points else None)
            if kept[1] is not None:
                figures.append(kept[1])
        # the kept answer is shared by every request: each gets a copy of its own
        return msgspec.structs.replace(answer, whole_run=answer.whole_run + figures)

    def _tb_run(self, directory: str) -> str:
        """TensorBoard's name of the run in ``directory``: its path relative to the logdir."""
        if storage.is_remote(directory):
            return storage.relpath(directory, self._store.logdir)
        rel = os.path.relpath(directory, os.path.realpath(self._store.logdir))
        return rel.replace(os.sep, "/")

    @wrappers.Request.application
    def _serve_trace(self, request):
        target = self._resolve(request.args, worker=True, step="required")
        return http_util.Respond(request, self.trace_impl(target), "application/json")

    def trace_impl(self, target: Target) -> bytes:
        """The step as a `StepTrace`, already encoded: it is cut out of its file as JSON bytes."""
        ref = target.worker.refs[target.rows[0]]
        f = next(f for f in target.run.workers[target.worker.name] if f.name == ref.span.file)
        try:
            body = self._store.step_trace(f, target.step)
        except TraceError as e:
            raise errors.NotFoundError(f"the trace of step {target.step} cannot be read again: {e.reason}") from None
        if body is None:
            raise errors.NotFoundError(f"{f.name} no longer holds step {target.step}")
        return body

    @wrappers.Request.application
    def _serve_kernels(self, request):
        target = self._resolve(request.args, worker=True, step="optional")
        return _json(request, self.kernels_impl(target, _phase_arg(request.args, target.worker)))

    def kernels_impl(self, target: Target, phase: str | None) -> KernelsAnswer:
        w = target.worker
        rows = target.rows[:1] if target.rows is not None else w.full().tolist()
        return kernels_answer(target.run.name, w, rows, target.step, phase)

    @wrappers.Request.application
    def _serve_modules(self, request):
        return _json(request, self.modules_impl(self._resolve(request.args, worker=True, step="optional")))

    def modules_impl(self, target: Target) -> ModulesAnswer:
        w = target.worker
        rows = target.rows[:1] if target.rows is not None else w.full().tolist()
        return modules_answer(target.run.name, w, rows, target.step)

    @wrappers.Request.application
    def _serve_ops(self, request):
        target = self._resolve(request.args, worker=True)
        group = request.args.get("group") or "name"
        if group not in GROUPS:
            raise errors.InvalidArgumentError(f"parameter 'group' must be one of {', '.join(GROUPS)}, not {group!r}")
        return _json(request, self.ops_impl(target, _phase_arg(request.args, target.worker), group))

    def ops_impl(self, target: Target, phase: str | None, group: str) -> OpsAnswer:
        """Every op over all profiled steps; kept per worker version, so asking again is free."""
        answer = self._store.derived(target.run, target.worker.name, run_ops, phase, group)
        answer.run = target.run.name
        return answer

    @wrappers.Request.application
    def _serve_memory(self, request):
        return _json(request, self.memory_impl(self._resolve(request.args, worker=True, step="required")))

    def memory_impl(self, target: Target) -> MemoryAnswer:
        w = target.worker
        ref = w.refs[target.rows[0]]
        span, i = ref.span, ref.index
        step = span.steps[i]
        lanes = span.lanes
        rows = lanes.rows(i)
        main = lanes.lane[rows] == 0  # the loop's thread: its phase segments
        bands = [(round((a - step.start) / 1000.0, 4), round((b - step.start) / 1000.0, 4), span.phases[p])
                 for a, b, p in zip(lanes.start[rows][main].tolist(), lanes.end[rows][main].tolist(),
                                    lanes.phase[rows][main].tolist())]
        return MemoryAnswer(run=target.run.name, worker=w.name, step=target.step, wall_ms=ms(step.wall),
                            recorded=any(len(s.memory_curve.step) for s in w.spans),
                            devices=memory_series(span, i), bands=bands, apart=apart_bands(span, i))

    @wrappers.Request.application
    def _serve_memory_events(self, request):
        return _json(request, self.memory_events_impl(self._resolve(request.args, worker=True, step="optional")))

    def memory_events_impl(self, target: Target) -> MemoryEventsAnswer:
        if target.rows is None:
            return run_memory(target.run.name, target.worker)
        ref = target.worker.refs[target.rows[0]]
        return MemoryEventsAnswer(run=target.run.name, worker=target.worker.name, step=target.step,
                                  devices=memory_devices(ref.span, ref.index))

    @wrappers.Request.application
    def _serve_collectives(self, request):
        target = self._resolve(request.args, step="optional")
        worker = request.args.get("worker") or None
        if worker is not None and worker not in target.run.workers:
            raise errors.NotFoundError(f"run {target.run.name!r} has no worker {worker!r}")
        return _json(request, self.collectives_impl(target, worker))

    def collectives_impl(self, target: Target, worker: str | None) -> CollectivesAnswer:
        run = target.run
        workers = [w for w in (self._store.worker(run, name) for name in run.workers) if w.spans]
        if target.step is not None and not any(target.step in w.numbers for w in workers):
            raise errors.NotFoundError(f"no worker of run {run.name!r} has step {target.step}")
        return collectives_answer(run.name, workers, worker, target.step)

    @wrappers.Request.application
    def _serve_capture(self, request):
        """GET: the run's captures; POST (with the `ASK_HEADER` header, sent to the address
        TensorBoard serves on from its own origin: `origin.Served`): ask for one first."""
        ask = request.method == "POST"
        if ask and (refused := self._served.refusal(request.environ)):
            raise errors.PermissionDeniedError(f"not asked: {refused}")
        if ask and request.headers.get(ASK_HEADER) != "ask":
            raise errors.InvalidArgumentError(f"a capture is asked by a POST with the header {ASK_HEADER}: ask")
        steps = _int_arg(request.args, "steps")
        if steps is not None and steps < 1:
            raise errors.InvalidArgumentError(f"parameter 'steps' must be at least 1, not {steps}")
        target = self._resolve(request.args)
        return _json(request, capture_impl(self._store.logdir, target.run, ask=ask, steps=steps,
                                           locked=self._read_only))

    # --- arguments --------------------------------------------------------------------------------

    def _resolve(self, args, *, worker: bool = False, step: str | None = None, side: str = "") -> Target:
        """The run (always), worker (``worker``) and step (``step``: ``"required"`` or ``"optional"``)
        that the parameters ``run``, ``worker``, ``step`` name, or ``run_a``, … for ``side="a"``.

        The worker defaults to the run's lowest rank, else its first worker. Malformed or missing
        parameters are a 400, names not discovered under the logdir a 404. The logdir is rescanned
        first (at most every half second), so that any route sees new files and starts loading them.
        """
        suffix = f"_{side}" if side else ""
        number = _int_arg(args, "step" + suffix, required=step == "required") if step else None
        self._store.refresh()
        run_name = args.get("run" + suffix)
        if not run_name:
            raise errors.InvalidArgumentError(f"missing parameter {'run' + suffix!r}")
        run = self._store.run(run_name)
        if run is None:
            raise errors.NotFoundError(f"no run named {run_name!r}")
        if not worker:
            return Target(run, step=number)
        workers = run.workers
        if not workers:
            raise errors.NotFoundError(f"run {run.name!r} has no trace files (yet)")
        name = args.get("worker" + suffix)
        if not name:
            name = min(workers, key=lambda w: rank_order(rank_of(w, self._store.analyses(run, w)), w))
        elif name not in workers:
            raise errors.NotFoundError(f"run {run.name!r} has no worker {name!r}")
        w = self._store.worker(run, name)
        if number is None:
            return Target(run, w)
        rows = [k for k, n in enumerate(w.numbers) if n == number]
        if not rows:
            raise errors.NotFoundError(f"worker {name!r} of run {run.name!r} has no step {number}")
        return Target(run, w, number, rows)

    # --- scalars ----------------------------------------------------------------------------------

    def _phase_scalars(self, environ, runs: list[str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
        """TensorBoard run -> phaseprof tag -> its (step, value) points, for ``runs`` in one request."""
        if self._data_provider is None:
            return {}
        ctx = plugin_util.context(environ)
        eid = plugin_util.experiment_id(environ)
        listing = self._data_provider.list_scalars(ctx, experiment_id=eid, plugin_name="scalars",
                                                   run_tag_filter=provider.RunTagFilter(runs=runs))
        tags = sorted({t for run in runs for t in listing.get(run, {}) if t.startswith(SCALAR_PREFIX)})
        if not tags:
            return {}
        data = self._data_provider.read_scalars(ctx, experiment_id=eid, plugin_name="scalars",
                                                downsample=_ALL_SAMPLES,
                                                run_tag_filter=provider.RunTagFilter(runs=runs, tags=tags))
        return {run: {tag: [(d.step, d.value) for d in points] for tag, points in by_tag.items()}
                for run, by_tag in data.items()}

    def _has_phase_scalars(self) -> bool:
        """Whether any run holds phaseprof scalars (a run profiled before its first trace)."""
        if self._data_provider is None:
            return False
        try:
            listing = self._data_provider.list_scalars(tb_context.RequestContext(), experiment_id="",
                                                       plugin_name="scalars")
        except Exception:  # noqa: BLE001 - a data provider hiccup only means "not (yet)"
            return False
        return any(t.startswith(SCALAR_PREFIX) for tags in listing.values() for t in tags)


def _json(request, answer: msgspec.Struct):
    return http_util.Respond(request, msgspec.json.encode(answer), "application/json")


def _int_arg(args, name: str, required: bool = False) -> int | None:
    """An integer parameter: ASCII digits with an optional leading ``-``; anything else is a 400."""
    value = args.get(name)
    if value is None or value == "":
        if required:
            raise errors.InvalidArgumentError(f"missing parameter {name!r}")
        return None
    if not _INTEGER.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise errors.InvalidArgumentError(f"parameter {name!r} must be an integer, not {shown!r}")
    if len(value.lstrip("-").lstrip("0")) > _MAX_DIGITS or not -(2**63) <= int(value) < 2**63:
        raise errors.InvalidArgumentError(f"parameter {name!r} is out of range (step numbers are 64-bit integers)")
    return int(value)


def _phase_arg(args, w: Worker) -> str | None:
    """The optional ``phase`` parameter: one of the worker's phases (404 otherwise), or None."""
    phase = args.get("phase") or None
    if phase is not None and phase not in w.phases:
        raise errors.NotFoundError(f"worker {w.name!r} has no phase named {phase!r}")
    return phase


def _side(target: Target) -> tuple[Worker, np.ndarray]:
    """One side of a comparison: the worker and its rows (the step asked for, else the steps its summary
    stands for: no compiling or warm-up step)."""
    rows = target.rows if target.rows is not None else target.worker.steady()
    return target.worker, np.array(rows, dtype=np.int64)


def _label(target: Target) -> str:
    label = f"{target.run.name} · {target.worker.name}"
    return label if target.step is None else f"{label} · step {target.step}"


def _static_files() -> dict[str, str]:
    """The files of the built bundle, by name: the only names the static routes answer to."""
    if not os.path.isdir(_STATIC_DIR):
        return {}
    return {name: os.path.join(_STATIC_DIR, name) for name in os.listdir(_STATIC_DIR)
            if os.path.isfile(os.path.join(_STATIC_DIR, name))}
