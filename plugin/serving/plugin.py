"""The Step Phases tab's backend: TensorBoard plugin routes over the trace store and the scalars.

Each route is a ``_serve_<route>`` handler that parses the request and responds (through
``http_util.Respond``, which sets content type, nosniff and the security policy) with what
`facade.Analysis` answers, as the CLI and `phaseprof.analyze` do: an answer Struct
(`phaseprof.plugin.answers`). Its errors become TensorBoard's typed ones (`_route`: 404
`errors.NotFoundError`, 400 `errors.InvalidArgumentError`), as TensorBoard's own plugins raise.
``run`` / ``worker`` / ``step`` parameters are names looked up among what was discovered under the
logdir (never used to build a path); each lookup also rescans the logdir, so every route starts the
loading it needs. The routes are documented in ``plugin/http_api.md``.
"""

from __future__ import annotations

import functools
import os
import re

import msgspec
from tensorboard import context as tb_context
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from phaseprof.contract import SCALAR_PREFIX

from ..facade import Analysis, BadArgument, NotFound, Series, Side
from ..reading import storage
from .capture import ASK_HEADER, capture_impl, read_only
from .origin import Served
from .store import TraceStore

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


def _route(handler):
    """A route: a WSGI application over ``handler(self, request)``, whose `facade` errors become
    TensorBoard's (a name the logdir does not hold: 404; an argument no answer fits: 400)."""

    @wrappers.Request.application
    @functools.wraps(handler)
    def serve(self, request):
        try:
            return handler(self, request)
        except NotFound as e:
            raise errors.NotFoundError(str(e)) from None
        except BadArgument as e:
            raise errors.InvalidArgumentError(str(e)) from None

    return serve


def _answering(method: str, step: str | None = None, whole_run: bool = False,
               **params: str | None):
    """A route that answers ``Analysis.<method>(run, worker=…, step=…, **params)``: the step as
    `_names` parses it (not passed where ``step`` is None), each of ``params`` from the parameter
    of its name, its default where that is missing or empty. ``whole_run``: ``<method>(run)``
    alone, over the scalars TensorBoard holds for the request as well as the traces."""

    def serve(self, request):
        run, worker, number = _names(request.args, step=step)
        if whole_run:
            return _json(request, getattr(self._analysis(request.environ), method)(run))
        given = {name: request.args.get(name) or default for name, default in params.items()}
        if step:
            given["step"] = number
        return _json(request, getattr(self._analysis(), method)(run, worker=worker, **given))

    serve.__name__ = serve.__qualname__ = f"_serve_{method}"
    return _route(serve)


def _names(args, *, step: str | None = None, side: str = "") -> tuple[str, str | None, int | None]:
    """The ``run``, ``worker`` and ``step`` parameters (``run_a``, … for ``side="a"``): the run is
    required; the step is parsed when ``step`` is ``"required"`` or ``"optional"``, else None.
    Malformed or missing parameters are a 400; the names are looked up by `facade.Analysis`
    (never used to build a path)."""
    suffix = f"_{side}" if side else ""
    number = _int_arg(args, "step" + suffix, required=step == "required") if step else None
    run = args.get("run" + suffix)
    if not run:
        raise errors.InvalidArgumentError(f"missing parameter {'run' + suffix!r}")
    return run, args.get("worker" + suffix) or None, number


class PhaseprofPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        self._data_provider = context.data_provider
        self._read_only = read_only(context.flags)
        self._store = TraceStore(context.logdir or "", read_only=self._read_only is not None)
        self._static = _static_files()
        self._served = Served(context.flags)  # the Host and Origin a POST /capture must carry
        #: (run, rank) -> (the rank's phase scalars, its figures over every timed step), across requests
        #: (`facade.Analysis.ranks`)
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

    # --- data routes: each parses its parameters and asks `facade.Analysis` ---------------------

    def _analysis(self, environ=None) -> Analysis:
        """The logdir's analyses, over the trace store; scalars from TensorBoard's data provider
        for the request ``environ`` (none without one)."""
        return Analysis(source=self._store, kept=self._whole_runs,
                        scalars=lambda dirs: self._dir_scalars(environ, dirs) if environ is not None else {})

    # the routes that answer a run's worker (and step) by `facade.Analysis` alone
    _serve_steps = _answering("steps")
    _serve_step = _answering("step", step="required")
    _serve_kernels = _answering("kernels", step="optional", phase=None)
    _serve_modules = _answering("modules", step="optional")
    _serve_ops = _answering("ops", phase=None, group="name")
    _serve_memory = _answering("memory", step="required")
    _serve_memory_events = _answering("memory_events", step="optional")
    _serve_collectives = _answering("collectives", step="optional")
    # ...and those that answer a whole run, from the scalars TensorBoard holds too
    _serve_timeline = _answering("timeline", whole_run=True)
    _serve_ranks = _answering("ranks", whole_run=True)

    @_route
    def _serve_runs(self, request):
        self._store.refresh()
        return _json(request, self._analysis().runs())

    @_route
    def _serve_compare(self, request):
        a, b = (Side(*_names(request.args, step="optional", side=side)) for side in ("a", "b"))
        device = request.args.get("device") or "cpu"
        return _json(request, self._analysis().compare(a, b, request.args.get("op") or None, device))

    @_route
    def _serve_trace(self, request):
        run, worker, step = _names(request.args, step="required")
        return http_util.Respond(request, self._analysis().trace(run, step, worker), "application/json")

    @_route
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
        run, _, _ = _names(request.args)
        target = self._analysis().target(run, with_worker=False)
        return _json(request, capture_impl(self._store.logdir, target.run, ask=ask, steps=steps,
                                           locked=self._read_only))

    def _tb_run(self, directory: str) -> str:
        """TensorBoard's name of the run in ``directory``: its path relative to the logdir."""
        if storage.is_remote(directory):
            return storage.relpath(directory, self._store.logdir)
        rel = os.path.relpath(directory, os.path.realpath(self._store.logdir))
        return rel.replace(os.sep, "/")

    # --- scalars ----------------------------------------------------------------------------------

    def _dir_scalars(self, environ, directories: list[str]) -> dict[str, Series]:
        """Each folder's phaseprof scalars as TensorBoard's data provider holds them."""
        names = {directory: self._tb_run(directory) for directory in directories}
        series = self._phase_scalars(environ, list(names.values()))
        return {directory: series[name] for directory, name in names.items() if series.get(name)}

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


def _static_files() -> dict[str, str]:
    """The files of the built bundle, by name: the only names the static routes answer to."""
    if not os.path.isdir(_STATIC_DIR):
        return {}
    return {name: os.path.join(_STATIC_DIR, name) for name in os.listdir(_STATIC_DIR)
            if os.path.isfile(os.path.join(_STATIC_DIR, name))}
