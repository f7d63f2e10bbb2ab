"""The Step Phases tab's backend: TensorBoard plugin routes over the trace store and the scalars.

Handlers only parse and check arguments, call the analysis, and respond (through
``http_util.Respond``, which sets content type, nosniff and the security policy). Run, worker and
step parameters are looked up among what was discovered under the logdir; they are never used to
build a path. The routes are documented in ``plugin/http_api.md``.
"""

from __future__ import annotations

import os
import threading

import msgspec
from tensorboard import context as tb_context
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from phaseprof.contract import SCALAR_PREFIX

from ..analysis.compare import compare
from ..analysis.ranks import rank_of, rank_order, ranks
from ..analysis.steps import find_step, phase_names, step_detail, step_refs, step_rows
from ..analysis.summary import summarize
from ..analysis.timeline import timeline
from ..reading.discovery import Run
from .store import LOADING, PENDING, TraceStore

PLUGIN_NAME = "phaseprof"
_STATIC_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "static")
_CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".map": "application/json",
                  ".svg": "image/svg+xml", ".png": "image/png", ".woff2": "font/woff2", ".txt": "text/plain"}
#: Scalars per tag asked of the data provider: all it kept (TensorBoard keeps 1,000 by default).
_ALL_SAMPLES = 10**9


class PhaseprofPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        self._data_provider = context.data_provider
        self._store = TraceStore(context.logdir or "")
        self._summaries: dict[tuple, dict] = {}
        self._summaries_lock = threading.Lock()
        self._static = _static_files()
        self._store.refresh_soon(force=True)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Step Phases")

    def is_active(self) -> bool:
        """From the cached scan; a rescan runs in the background when it is due."""
        self._store.refresh_soon()
        return self._store.has_traces() or self._has_phase_scalars()

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

    def runs_impl(self) -> dict:
        out, problems = [], []
        for run in self._store.runs():
            workers = []
            for worker, files in run.workers.items():
                spans = [self._store.span(f) for f in files]
                for s in spans:
                    if s.error:
                        problems.append({"path": os.path.join(run.name, s.file.name), "error": s.error})
                workers.append({
                    "worker": worker,
                    "rank": rank_of(worker, [s.analysis for s in spans if s.analysis is not None]),
                    "state": LOADING if any(s.state in (PENDING, LOADING) for s in spans) else "ready",
                    "spans": [{"file": s.file.name, "size": s.file.size, "state": s.state,
                               "steps": len(s.analysis.steps) if s.analysis else None, "error": s.error}
                              for s in spans],
                })
            out.append({"run": run.name, "has_scalars": run.has_scalars, "workers": workers})
        return {"runs": out, "loading": self._store.progress(), "errors": problems}

    @wrappers.Request.application
    def _serve_steps(self, request):
        self._store.refresh()
        run = self._run(request.args.get("run"))
        worker = self._worker(run, request.args.get("worker"))
        return _json(request, self.steps_impl(run, worker))

    def steps_impl(self, run: Run, worker: str) -> dict:
        spans = self._store.analyses(run, worker)
        return {
            "run": run.name,
            "worker": worker,
            "workers": list(run.workers),
            "phases": phase_names(spans),
            "gpu": any(s.has_gpu for s in spans),
            "steps": step_rows(spans),
            "summary": self._summary(run, worker),
        }

    @wrappers.Request.application
    def _serve_step(self, request):
        run = self._run(request.args.get("run"))
        worker = self._worker(run, request.args.get("worker"))
        number = _int_arg(request, "step", required=True)
        spans = self._store.analyses(run, worker)
        ref = find_step(spans, number)
        if ref is None:
            raise errors.NotFoundError(f"worker {worker!r} of run {run.name!r} has no step {number}")
        detail = step_detail(ref, phase_names(spans))
        detail.update(run=run.name, worker=worker)
        return _json(request, detail)

    @wrappers.Request.application
    def _serve_timeline(self, request):
        run = self._run(request.args.get("run"))
        return _json(request, self.timeline_impl(request, run))

    def timeline_impl(self, request, run: Run) -> dict:
        series = self._phase_scalars(request.environ, run.name)
        if not series:
            raise errors.NotFoundError(f"run {run.name!r} has no phaseprof scalars (yet)")
        dense = max(series.values(), key=len)
        kept_all = not dense or len(dense) >= dense[-1][0] - dense[0][0] + 1
        profiled = [ref.number for worker in run.workers for ref in step_refs(self._store.analyses(run, worker))
                    if not ref.empty]
        out = timeline(series, profiled, kept_all)
        out["run"] = run.name
        return out

    @wrappers.Request.application
    def _serve_compare(self, request):
        a = self._side(request, "a")
        b = self._side(request, "b")
        phases = phase_names(a[1] + b[1])
        result = compare(a[2], b[2], phases)
        result["a"]["label"], result["b"]["label"] = a[0], b[0]
        result["phases"] = phases
        return _json(request, result)

    def _side(self, request, side: str):
        """(label, the worker's analyses, the chosen steps) of one side of a comparison."""
        run = self._run(request.args.get(f"run_{side}"), param=f"run_{side}")
        worker = self._worker(run, request.args.get(f"worker_{side}"), param=f"worker_{side}")
        spans = self._store.analyses(run, worker)
        refs = step_refs(spans)
        number = _int_arg(request, f"step_{side}")
        label = f"{run.name} · {worker}"
        if number is not None:
            refs = [r for r in refs if r.number == number]
            if not refs:
                raise errors.NotFoundError(f"worker {worker!r} of run {run.name!r} has no step {number}")
            label += f" · step {number}"
        return label, spans, refs

    @wrappers.Request.application
    def _serve_ranks(self, request):
        run = self._run(request.args.get("run"))
        workers = {w: self._store.analyses(run, w) for w in run.workers}
        out = ranks({w: spans for w, spans in workers.items() if spans})
        out["run"] = run.name
        return _json(request, out)

    # --- argument checks --------------------------------------------------------------------------

    def _run(self, name: str | None, *, param: str = "run") -> Run:
        if not name:
            raise errors.InvalidArgumentError(f"missing parameter {param!r}")
        run = self._store.run(name)
        if run is None:
            raise errors.NotFoundError(f"no run named {name!r}")
        return run

    def _worker(self, run: Run, name: str | None, *, param: str = "worker") -> str:
        """The named worker of ``run``, or by default its lowest rank (else its first worker)."""
        workers = run.workers
        if not workers:
            raise errors.NotFoundError(f"run {run.name!r} has no trace files (yet)")
        if not name:
            return min(workers, key=lambda w: rank_order(rank_of(w, self._store.analyses(run, w)), w))
        if name not in workers:
            raise errors.NotFoundError(f"run {run.name!r} has no worker {name!r}")
        return name

    # --- scalars ----------------------------------------------------------------------------------

    def _phase_scalars(self, environ, run: str) -> dict[str, list[tuple[int, float]]]:
        if self._data_provider is None:
            return {}
        ctx = plugin_util.context(environ)
        eid = plugin_util.experiment_id(environ)
        listing = self._data_provider.list_scalars(ctx, experiment_id=eid, plugin_name="scalars",
                                                   run_tag_filter=provider.RunTagFilter(runs=[run]))
        tags = [t for t in listing.get(run, {}) if t.startswith(SCALAR_PREFIX)]
        if not tags:
            return {}
        data = self._data_provider.read_scalars(ctx, experiment_id=eid, plugin_name="scalars",
                                                downsample=_ALL_SAMPLES,
                                                run_tag_filter=provider.RunTagFilter(runs=[run], tags=tags))
        return {tag: [(d.step, d.value) for d in points] for tag, points in data.get(run, {}).items()}

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

    def _summary(self, run: Run, worker: str) -> dict:
        key = (run.name, worker, self._store.version(run, worker))
        with self._summaries_lock:
            cached = self._summaries.get(key)
        if cached is None:
            cached = summarize(self._store.analyses(run, worker))
            with self._summaries_lock:
                self._summaries = {k: v for k, v in self._summaries.items() if k[:2] != key[:2]}
                self._summaries[key] = cached
        return cached


def _json(request, body: dict):
    return http_util.Respond(request, msgspec.json.encode(body), "application/json")


def _int_arg(request, name: str, required: bool = False) -> int | None:
    value = request.args.get(name)
    if value is None or value == "":
        if required:
            raise errors.InvalidArgumentError(f"missing parameter {name!r}")
        return None
    try:
        return int(value)
    except ValueError:
        raise errors.InvalidArgumentError(f"parameter {name!r} must be an integer, not {value!r}") from None


def _static_files() -> dict[str, str]:
    """The files of the built bundle, by name: the only names the static routes answer to."""
    if not os.path.isdir(_STATIC_DIR):
        return {}
    return {name: os.path.join(_STATIC_DIR, name) for name in os.listdir(_STATIC_DIR)
            if os.path.isfile(os.path.join(_STATIC_DIR, name))}
