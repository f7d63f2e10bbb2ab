"""`PhaseProfiler`: one object in a PyTorch training loop that splits every step into phases (data,
forward, backward, optimizer, other, and any phase you name), times them on every step, and drives
``torch.profiler`` through its ``schedule(wait, warmup, active, repeat)`` window::

    prof = PhaseProfiler(logdir="./profile", run="baseline", wait=1, warmup=1, active=10, repeat=1)
    prof.attach(model, optimizer)            # phases and step boundaries from now on (or several of each)
    for data, target in prof.data(loader):   # optional: times the data phase
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()                      # the step boundary; the profiler's step is called for you
    prof.close()

What it writes under ``<logdir>/<run>/``: the profiler's traces (`traces`), with a
``phaseprof::<phase>`` range around each phase (`ranges`), and every step's phase times as
TensorBoard scalars (`recorder`). Where the phases come from is in `hooks`; how they are timed in
`tracker` (host clock) and `cuda_timing` (CUDA events). One PhaseProfiler runs per process at a
time, on the thread that started it: the loop's thread. It starts on first use (`attach`, `data`,
`phase`, `paused`, `step` or ``with``), which also begins step 0. Evaluation passes between training
steps, and ``with prof.paused():`` blocks, are kept out of the steps (see `hooks`, `tracker`).
A SIGTERM closes it (writing the active window's trace) before the process's own handling (`signals`).
A child forked from the process (a DataLoader worker, a ``fork`` Pool) never closes or writes
the run.

Faults never stop training: output that cannot be written, a trace that fails, an internal error in
a hook are reported by one warning and listed in the summary on close. Misuse (attaching twice,
stepping after close, phases closed out of order or nested in themselves) raises at the call.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from rich.console import Console
from torch.profiler import ProfilerAction

from phaseprof.contract import (
    CPUS_KEY,
    DATA,
    OPTIMIZER,
    OTHER,
    OUT_OF_STEP,
    PAUSED,
    rank_scalars_dir,
    validate_phase_name,
)
from phaseprof.plugin.reading import storage

from .capture import CaptureWatcher, Slowdown
from .cuda_timing import CudaPhaseTimer
from .faults import Faults
from .hooks import Attachment
from .module_ranges import ModuleRanges
from .ranges import Ranges
from .recorder import StepRecorder
from .records import StepTimes
from .signals import CloseOnSigterm
from .source_analysis import SourceAnalysis
from .summary import print_summary
from .traces import TraceWriter, worker_name
from .tracker import AFTER_LAST, HOOK, PhaseError, PhaseTracker, phase_ns
from .upload import Uploader, close_wait_s, staging_root

__all__ = ["PhaseProfiler", "PhaseError"]

T = TypeVar("T")

_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
_get_ident, _perf_counter_ns, _wall_time = threading.get_ident, time.perf_counter_ns, time.time
_NEW, _RUNNING, _CLOSED = "new", "running", "closed"
_INHERITED = "inherited"  # the running profiler as a forked child sees it: its parent's run
#: Phases that are not a step's training work: a step open at close with only these is dropped.
_NOT_WORK = {DATA, OTHER, OPTIMIZER, AFTER_LAST, HOOK, *OUT_OF_STEP}
_running: PhaseProfiler | None = None  # the one running in this process


def _inherited_in_child() -> None:
    """In a forked child (a DataLoader worker, a ``fork`` Pool's), the running profiler is the
    parent's: there it never closes, writes, uploads or beats (its threads did not follow the
    fork), so the parent's run stays whole; the child may start a profiler of its own."""
    global _running
    if _running is not None:
        _running._state = _INHERITED
        _running = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_inherited_in_child)

# torch warns when a second profiling cycle starts that results of the first are cleared, and to
# pass acc_events=True to keep them. Traces are written at the end of each cycle: nothing is lost.
warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")


class PhaseProfiler:
    """Per-step phase timing for every step, and ``torch.profiler`` traces for its active window.

    Args:
        logdir: the TensorBoard log directory; this run writes into ``<logdir>/<run>/``.
        run: the run's name, a relative path that stays inside ``logdir``; by default the start
            time, e.g. ``20260430-153012``.
        wait, warmup, active, repeat: ``torch.profiler.schedule``: skip ``wait`` steps, warm up for
            ``warmup``, record ``active`` steps into one trace file; ``repeat`` such cycles (0: until
            close). Steps are timed all along, profiled or not.
        record_shapes, profile_memory, with_stack, activities: passed to ``torch.profiler.profile``.
        gzip: write ``.pt.trace.json.gz`` traces (default) rather than plain JSON; they are
            compressed in a background process, not in the loop (``close()`` waits for them).
        modules: a range around each call of each module of the attached models while the profiler
            records, named by the module's path (``Net.encoder.layers.3``), for the module view: each
            module's forward and backward time (`module_ranges`; its cost is in docs/performance.md).
        analyze_traces: after each trace is written, analyse it in a background process at idle
            priority and store the analysis beside it (``<run>/.phaseprof/``), so that TensorBoard
            and ``phaseprof report`` read that instead of the trace (default True).
    """

    def __init__(self, logdir: str = "./profile", run: str | None = None, *, wait: int = 1, warmup: int = 1,
                 active: int = 10, repeat: int = 1, record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, activities: Iterable[torch.profiler.ProfilerActivity] | None = None,
                 gzip: bool = True, analyze_traces: bool = True,
                 capture_on_slowdown: bool | Slowdown = False, modules: bool = False) -> None:
        if min(wait, warmup, repeat) < 0 or active < 1:
            raise ValueError(f"the schedule needs wait, warmup, repeat >= 0 and active >= 1, got wait={wait}, "
                             f"warmup={warmup}, active={active}, repeat={repeat}")
        self.logdir = os.fspath(logdir)
        if storage.is_remote(self.logdir):
            storage.filesystem(self.logdir)  # StorageError now, naming the extra to install, if it is missing
        self.run = check_run_name(run) if run is not None else time.strftime("%Y%m%d-%H%M%S")
        self.run_dir = _run_dir(self.logdir, self.run)
        self._uploader: Uploader | None = None
        self._schedule = dict(wait=wait, warmup=warmup, active=active, repeat=repeat)
        self._options = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
                             activities=activities)
        self._gzip = gzip
        self._analyze_traces = analyze_traces
        self._slowdown = Slowdown() if capture_on_slowdown is True else capture_on_slowdown or None
        #: The current step's number: ``ProfilerStep#<step_num>`` in traces, the step of its scalars.
        self.step_num = 0
        self._state = _NEW
        self._attachment: Attachment | None = None
        self._modules = modules
        self._module_ranges: ModuleRanges | None = None
        self._steps_with_optimizer = False
        self._valid_names: set[str] = set()

    # -- the loop's API ---------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module | Sequence[torch.nn.Module],
               optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None) -> PhaseProfiler:
        """Time the forward of ``model`` (a module, or several: ``[generator, discriminator]``),
        ``loss.backward()``, and the ``zero_grad`` and ``step`` of ``optimizer`` (one, or several).
        A step ends when an optimizer's ``step()`` returns and every attached optimizer has stepped
        since the step began: each step of a single optimizer; the last update of a GAN's iteration.
        Without an optimizer, end steps with `step`. Returns self."""
        return self._attach(model, optimizer)

    def _attach(self, model: torch.nn.Module | Sequence[torch.nn.Module],
                optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None,
                also: tuple[torch.nn.Module, ...] = (), watch_eval: bool | None = None,
                optimizers_end_steps: bool = True) -> PhaseProfiler:
        """`attach`, for the framework integrations too: ``also`` more modules whose own calls are
        forward; ``watch_eval`` tells evaluation forwards apart from the start (default: with an
        optimizer; without, from the first backward); ``optimizers_end_steps`` False: the framework
        ends the steps."""
        if self._attachment is not None:
            raise RuntimeError("this PhaseProfiler is already attached; attach it once, before the loop")
        models = _several(model, torch.nn.Module, "torch.nn.Module")
        if not models:
            raise TypeError("attach() needs a torch.nn.Module")
        optimizers = _several(optimizer, torch.optim.Optimizer, "torch.optim.Optimizer")
        self._start()
        self._attachment = Attachment(models, optimizers, self._phases, also=also,
                                      watch_eval=bool(optimizers) if watch_eval is None else watch_eval,
                                      on_optimizer_step=self._end_step_by_hook,
                                      optimizers_end_steps=optimizers_end_steps)
        self._steps_with_optimizer = bool(optimizers) and optimizers_end_steps
        if self._modules:
            try:
                self._module_ranges = ModuleRanges(models, lambda: self._recording, self._faults)
            except Exception as e:  # noqa: BLE001
                self._faults.report("could not hook the modules (modules=True)", e)
        return self

    def _name_run(self, run: str) -> None:
        """Name the run before it starts: the framework callbacks give every rank rank 0's name."""
        if self._state == _NEW:
            self.run = check_run_name(run)
            self.run_dir = _run_dir(self.logdir, self.run)

    def data(self, loader: Iterable[T]) -> Iterable[T]:
        """``loader``'s batches, each fetch timed as the data phase. The result behaves like
        ``loader`` otherwise: its attributes (``dataset``, ``sampler``...) and ``len`` pass through."""
        self._check_open("data()")
        return _TimedLoader(self, loader)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """``with prof.paused():`` keeps what runs inside out of every step (not timed, not in the
        scalars; a ``phaseprof::paused`` range in traces), e.g. a checkpoint or a sample generation."""
        self._start()
        opened = self._phases.begin(PAUSED)
        try:
            yield
        finally:
            self._phases.end(PAUSED, opened)

    def phase(self, name: str) -> _Phase:
        """``with prof.phase(name):`` marks a phase of your own, or a canonical one explicitly; phases
        nest (the innermost one is charged) but a phase cannot nest in itself."""
        if name not in self._valid_names:
            self._valid_names.add(validate_phase_name(name))
        return _Phase(self, name)

    def step(self) -> None:
        """End the current step, for loops with no attached optimizer (inference, or parameters
        updated by hand)."""
        self._start()
        self._check_loop_thread("step()")
        if self._steps_with_optimizer:
            raise RuntimeError("the attached optimizer's step() already ends each step: do not call prof.step() too")
        self._end_step()

    def close(self) -> None:
        """Stop profiling: write what is pending, restore the model, optimizer and autograd, print the
        summary and the command that opens TensorBoard. Closing twice does nothing."""
        global _running
        if self._state == _INHERITED:
            return
        if self._state != _RUNNING:
            self._state = _CLOSED
            return
        self._state = _CLOSED
        atexit.unregister(self.close)
        self._sigterm.restore()
        _running = None
        if self._attachment is not None:
            self._attachment.remove()
        if self._module_ranges is not None:
            self._module_ranges.remove()
        now = time.perf_counter_ns()
        gpu = self._phases.gpu
        last = StepTimes(self.step_num, time.time(), self._phases.stop(now), final=True)
        # The step open at close counts if it did training work (the loop ended inside it), not if it
        # only waited for a batch that never came, ran an evaluation or a trailing zero_grad().
        last.training = bool(set(phase_ns(last.host_log)) - _NOT_WORK)
        records = [last]
        if self._profiler is not None:
            try:
                self._profiler.stop()
            except Exception as e:  # noqa: BLE001
                self._faults.report("torch.profiler failed to stop", e)
            last.profiler_ns = time.perf_counter_ns() - now
        if self._capture is not None:
            self._capture.close()
        if gpu is not None:
            try:
                records = [r for record in records for r in gpu.end_step(record)] + gpu.finish()
            except Exception as e:  # noqa: BLE001
                self._faults.report("could not read the GPU times", e)
        self._recorder.add(records, now)
        self._recorder.close()
        self._traces.background.wait_for_traces()  # the run complete on disk when close() returns
        traces = self._traces.written
        staging = None
        if self._uploader is not None:  # and in the store: the analyses too, if they come in time
            self._traces.background.wait_for_analyses(close_wait_s())
            if not self._uploader.close():  # kept where they were staged; the summary says so
                staging = self._uploader.root
            else:
                local = self._uploader.local
                traces = [storage.join(self.run_dir, *os.path.relpath(t, local).split(os.sep))
                          for t in traces]
        if self._rank == 0:
            print_summary(Console(), self._recorder.stats, run=self.run, logdir=self.logdir,
                          traces=traces, faults=self._faults.summary(), staging=staging)

    def __enter__(self) -> PhaseProfiler:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- start ----------------------------------------------------------------------------------

    def _start(self) -> None:
        """Start on first use, from the thread that runs the loop."""
        global _running
        if self._state in (_RUNNING, _INHERITED):
            return
        if self._state == _CLOSED:
            raise RuntimeError(f"PhaseProfiler(run={self.run!r}) is closed; create a new one")
        if _running is not None:
            raise RuntimeError(f"PhaseProfiler(run={_running.run!r}) is still running in this process; "
                               "close it before starting another")
        self._rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        worker = worker_name()
        self._faults = Faults(self.run_dir)
        write_dir = self.run_dir
        if storage.is_remote(self.logdir):  # written to a staging folder, uploaded from there (`upload`)
            staging = staging_root()
            write_dir = os.path.join(staging, self.run)
            os.makedirs(write_dir, exist_ok=True)
            self._uploader = Uploader(staging, write_dir, self.run_dir, self._faults)
        # Under torch.distributed each rank's scalars are a TensorBoard run of their own (one run's
        # tags would collide across ranks).
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        scalars_dir = os.path.join(write_dir, rank_scalars_dir(self._rank)) if distributed else write_dir
        self._recorder = StepRecorder(scalars_dir, worker, self._faults)
        self._traces = TraceWriter(write_dir, worker, self._gzip, self._faults,
                                   SourceAnalysis(self._faults, analyse=self._analyze_traces,
                                                  awaited=self._uploader is not None))
        self._profiler = self._start_profiler()
        self._cuda_possible = torch.cuda.is_available()
        self._thread = threading.get_ident()
        self._phases = PhaseTracker(self._thread, Ranges(), self._faults)
        self._phases.start_step(time.perf_counter_ns(), self._recording, self._new_gpu_timer())
        self._capture = None
        try:  # request files beside the run, or objects under it in a store (`capture_store`)
            self._capture = CaptureWatcher(self, dist.get_world_size() if distributed else 1, self._slowdown)
        except Exception as e:  # noqa: BLE001
            self._faults.report("cannot watch for capture requests; steps are traced only as scheduled", e)
        self._state = _RUNNING
        _running = self
        atexit.register(self.close)
        self._sigterm = CloseOnSigterm(self.close)

    def _start_profiler(self) -> torch.profiler.profile | None:
        s = self._schedule
        self._profile_until = (s["wait"] + s["warmup"] + s["active"]) * s["repeat"] or None
        self._recording = False  # torch.profiler records the current step
        try:
            profiler = torch.profiler.profile(schedule=torch.profiler.schedule(**s), on_trace_ready=self._traces,
                                              **self._options)
            profiler.start()
        except Exception as e:  # noqa: BLE001
            self._faults.report("torch.profiler failed to start; steps are timed without traces", e)
            return None
        self._recording = profiler.current_action in _RECORDING
        if self._recording:
            self._record_cpus(profiler)
        return profiler

    def _record_cpus(self, profiler: torch.profiler.profile) -> None:
        """Write the CPUs this process may use into the trace being recorded: the data-loader advice is
        sized by them (`phaseprof.contract.CPUS_KEY`)."""
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        try:
            profiler.add_metadata_json(CPUS_KEY, json.dumps({"count": os.cpu_count(), "usable": usable}))
        except Exception as e:  # noqa: BLE001
            self._faults.report("the CPU count could not be written into the trace", e)

    def _new_gpu_timer(self) -> CudaPhaseTimer | None:
        """A CUDA timer if CUDA is initialised in this process (e.g. the model is on a GPU). Asking
        this rather than whether CUDA is available never initialises CUDA for a CPU run."""
        return CudaPhaseTimer() if self._cuda_possible and torch.cuda.is_initialized() else None

    # -- steps ------------------------------------------------------------------------------------

    def _end_step_by_hook(self) -> None:
        self._end_step(by_hook=True)

    def _end_step(self, by_hook: bool = False) -> None:
        """Close step ``step_num`` and open the next: step torch.profiler (which may write a trace)
        with no phase range open, then hand the step's times over; the time between the two steps
        is the profiler's own (`phaseprof.contract.PROFILER_TAG`), in no step, and the handover
        the hook's own, in the next step (`tracker.HOOK`). ``by_hook``: an optimizer's wrapper ends
        the step. Never raises; does nothing once closed, or for an optimizer stepped off the
        loop's thread."""
        if self._state != _RUNNING or _get_ident() != self._thread:
            return
        try:
            phases = self._phases
            now = _perf_counter_ns()
            record = StepTimes(self.step_num, _wall_time(), phases.cut(now, by_hook))
            gpu = phases.gpu
            self.step_num += 1
            if self._profiler is not None:
                self._step_profiler(self._profiler)
            capture = self._capture
            if self._profiler is None and capture is not None and capture.plan is not None:
                self._profiler = capture.begin(self)
                self._recording = self._profiler is not None and self._profiler.current_action in _RECORDING
            if gpu is None and self._cuda_possible:
                gpu = self._new_gpu_timer()
            if self._attachment is not None:
                self._attachment.watch_compiles()
            resumed = _perf_counter_ns()
            record.profiler_ns = resumed - now
            self._recorder.add(gpu.end_step(record) if gpu is not None else (record,), resumed)
            phases.start_step(_perf_counter_ns(), self._recording, gpu, hook_since=resumed)
        except Exception as e:  # noqa: BLE001
            self._faults.report("internal error at the end of a step", e)

    def _step_profiler(self, profiler: torch.profiler.profile) -> None:
        try:
            if self._profile_until is not None and self.step_num >= self._profile_until:
                self._profiler = None  # the schedule is over: stop paying for its steps
                profiler.stop()
            else:
                profiler.step()
        except Exception as e:  # noqa: BLE001
            self._profiler = None
            self._faults.report("torch.profiler failed; steps are timed without traces from here on", e)
        was_recording = self._recording
        self._recording = self._profiler is not None and profiler.current_action in _RECORDING
        if self._recording and not was_recording:  # a new trace: each carries the CPU count
            self._record_cpus(profiler)

    # -- checks -----------------------------------------------------------------------------------

    def _check_open(self, call: str) -> None:
        if self._state == _CLOSED:
            raise RuntimeError(f"{call} after close(): PhaseProfiler(run={self.run!r}) is closed")

    def _check_loop_thread(self, call: str) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError(f"{call} must be called on the thread that runs the loop (the one that started "
                               "the profiler)")


def _several(given: Any, kind: type, name: str) -> tuple:
    """``given`` as a tuple of ``kind``: one, a sequence of them, or None (none)."""
    if given is None:
        return ()
    items = (given,) if isinstance(given, kind) or not isinstance(given, (list, tuple)) else tuple(given)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"attach() needs a {name} or a list of them, got {type(item).__name__}")
    return items


def _run_dir(logdir: str, run: str) -> str:
    """``<logdir>/<run>``: a URL's path is "/"-separated on every system."""
    return storage.join(logdir, *run.split(os.sep)) if storage.is_remote(logdir) else os.path.join(logdir, run)


def check_run_name(run: str) -> str:
    """``run`` if it names a directory inside the logdir, else ValueError: a relative path with no
    ``..`` part (a run may be nested: ``ablation/lr0.1``)."""
    if not isinstance(run, str):
        raise TypeError(f"run must be a string, not {type(run).__name__}")
    parts = run.replace("\\", "/").split("/")
    if not run.strip() or "\0" in run or os.path.isabs(run) or os.path.splitdrive(run)[0] or parts[0] == "":
        raise ValueError(f"run={run!r} is not a run name: give a relative name, e.g. 'baseline'; "
                         "the run is written in <logdir>/<run>/")
    if ".." in parts:
        raise ValueError(f"run={run!r} would write outside the logdir: a run name may not contain '..'")
    return run


class _Phase:
    """``with prof.phase(name):`` — strict: raises PhaseError on nesting mistakes."""

    __slots__ = ("_prof", "_name", "_opened")

    def __init__(self, prof: PhaseProfiler, name: str) -> None:
        self._prof = prof
        self._name = name
        self._opened = False

    def __enter__(self) -> None:
        self._prof._start()
        self._opened = self._prof._phases.open(self._name)  # not inside eval or paused time

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        phases = self._prof._phases
        if exc_type is not None:  # unwinding: close it and what is open inside, never mask the error
            phases.end(self._name, self._opened)
        else:
            self._prof._check_open(f"leaving phase({self._name!r})")
            if self._opened:
                phases.close(self._name)


class _TimedLoader:
    """Iterates ``loader`` with each fetch (the first one's ``iter()`` included) in the data phase;
    anything else is the loader's (``dataset``, ``sampler.set_epoch``, ``batch_size``, ``len``...).
    A fetch in training mode ends an evaluation pass; one during evaluation is part of it."""

    def __init__(self, prof: PhaseProfiler, loader: Iterable[Any]) -> None:
        self._prof = prof
        self._loader = loader

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in ("_prof", "_loader"):  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __repr__(self) -> str:
        return f"prof.data({self._loader!r})"

    def __iter__(self) -> Iterator[Any]:
        prof = self._prof
        prof._start()
        phases = prof._phases
        begin, end = phases.begin, phases.end
        batches = None
        while True:
            if phases.apart and prof._attachment is not None and prof._attachment.training_mode():
                phases.leave_eval()
            opened = begin(DATA)
            try:
                if batches is None:
                    batches = iter(self._loader)
                batch = next(batches)
            except StopIteration:
                return
            finally:
                end(DATA, opened)
            yield batch
