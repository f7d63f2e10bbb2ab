"""The ``phaseprof`` command: ``report``, ``compare``, ``cache``, ``capture`` and ``upload`` (no
torch needed), ``demo`` (runs a profiled model)."""

from __future__ import annotations

import argparse
import gc
import sys

#: ``report --sort`` choices; `phaseprof.plugin.analysis.kernels.SORT_KEYS` (checked by a test) maps
#: them to fields, kept here so that ``--help`` never imports the analysis.
KERNEL_SORT_KEYS = ("total", "mean", "max", "calls", "occupancy", "blocks-per-sm", "registers", "shared-memory",
                    "name")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="phaseprof", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    report = sub.add_parser("report", help="per-step phase breakdown of traces, in the terminal or as JSON")
    report.add_argument("path", help="a logdir, one run directory, or one trace file")
    report.add_argument("--run", help="only this run (its directory relative to PATH; '.' for PATH itself)")
    report.add_argument("--step", type=int, help="only this step, with its ops per phase and memory")
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument("--evidence", action="store_true", help="print the figures behind each finding")
    report.add_argument("--kernels", action="store_true",
                        help="add each worker's kernels (over --step, or every step): time, occupancy, blocks per SM, "
                             "grid and block, registers, shared memory, tensor cores, launching op and phase")
    report.add_argument("--modules", action="store_true",
                        help="add each worker's nn.Modules (over --step, or every step): forward and backward time, "
                             "host and GPU, calls, ops (from PhaseProfiler(modules=True) or with_stack=True traces)")
    report.add_argument("--collectives", action="store_true",
                        help="add each run's collectives (over --step, or every step): calls, message size, time and "
                             "bus bandwidth per kind and group; each rank's compute, communication and overlap; "
                             "the rank the others wait for")
    report.add_argument("--sort", choices=KERNEL_SORT_KEYS, default="total",
                        help="order of the --kernels table, largest first (default: total time)")

    compare = sub.add_parser(
        "compare", help="regression gate: exit 1 when NEW is slower than BASE in a phase or the step",
        description="Compare the time per step of every phase of NEW against BASE, with a confidence interval "
                    "from the steps of each side. Exit status: 1 when a phase (or the step) got slower than "
                    "--threshold with confidence, 0 otherwise, 2 when an input cannot be compared.")
    compare.add_argument("base", metavar="BASE", help="a logdir, a run directory or a trace file")
    compare.add_argument("new", metavar="NEW", help="the same, for the code under test")
    compare.add_argument("--threshold", type=_share, default=0.05,
                         help="slower than this fraction counts (default 0.05: 5%%; '5%%' also accepted)")
    compare.add_argument("--confidence", type=_share, default=0.95,
                         help="confidence of the intervals, jointly over all phases (default 0.95)")
    compare.add_argument("--min-share", type=_share, default=0.01,
                         help="changes smaller than this fraction of the base step are never counted (default 0.01)")
    compare.add_argument("--source", choices=("scalars", "traces"),
                         help="every-step scalars or traced steps (default: scalars when both sides have them)")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")

    cache = sub.add_parser("cache", help="analyse traces now and store each analysis beside its trace",
                           description="Read each trace under the paths and store its analysis beside it (in "
                                       "<run>/.phaseprof/), where `report`, `compare` and TensorBoard find it "
                                       "instead of reading the trace. PhaseProfiler runs this after each trace.")
    cache.add_argument("paths", nargs="+", metavar="PATH", help="a logdir, a run directory or a trace file")
    cache.add_argument("--background", action="store_true",
                       help="run at idle priority: only on CPU time nothing else wants")
    cache.add_argument("--compress", action="store_true",
                       help="each PATH is a trace PhaseProfiler exported (….pt.trace.json.part): gzip it into place "
                            "(….pt.trace.json.gz, at niceness 10), then analyse it")
    cache.add_argument("--no-analysis", action="store_true", help="with --compress: compress only")
    cache.add_argument("--awaited", action="store_true",
                       help="with --background: niceness 10, not idle priority (a run written to a store waits "
                            "for its analyses at close, and idle priority starves beside busy processes)")

    capture = sub.add_parser(
        "capture", help="trace the next steps of a running training job",
        description="Ask a running PhaseProfiler (or Lightning / Hugging Face callback) for a trace of its next "
                    "steps, through a request file under the run; every rank traces the same step numbers. "
                    "Exit status: 0 when asked (with --wait: when every rank wrote its trace), 1 when the run "
                    "refused (it ended, another capture is running...), 2 when there is no such run.")
    capture.add_argument("logdir", metavar="LOGDIR", help="the logdir the job writes into (or its run directory)")
    capture.add_argument("--run", help="the run (its directory relative to LOGDIR); default: the one running")
    capture.add_argument("--steps", type=int, help="steps to trace (default: the job's configured `active`)")
    capture.add_argument("--ranks", type=_ranks, default=None,
                         help="'all' (default) or the ranks to trace, e.g. 0,3")
    capture.add_argument("--wait", action="store_true",
                         help="wait until the traces are written and analysed, and say what they hold")
    capture.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits at most (default 600)")

    upload = sub.add_parser(
        "upload", help="upload a run that a store did not take (its summary printed this command)",
        description="Upload what PhaseProfiler left in a staging folder (the bucket was "
                    "missing, writing was denied or the store was down when the run closed) to the "
                    "logdir URL it mirrors: what is missing or differs goes up, all of it is "
                    "confirmed by a listing, then the staging folder is removed. Run it again "
                    "after a failure: it resumes. Exit status: 0 when all of it is in the store, "
                    "1 when the store did not take all of it (the folder is kept), 2 on a wrong "
                    "argument.")
    upload.add_argument("staging", metavar="STAGING_DIR",
                        help="the staging folder the summary named")
    upload.add_argument("url", metavar="URL",
                        help="the logdir in the store, e.g. s3://bucket/profiles")

    demo = sub.add_parser("demo", help="profile the MNIST CNN (synthetic data) and a small inference run")
    demo.add_argument("--logdir", default="./profile")
    demo.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    demo.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")

    args = parser.parse_args(argv)
    if args.command == "report":
        return _report(args)
    if args.command == "compare":
        return _compare(args)
    if args.command == "cache":
        from phaseprof.cli.cache import cache_paths

        return cache_paths(args.paths, background=args.background, compress=args.compress,
                           analysis=not args.no_analysis, awaited=args.awaited)
    if args.command == "capture":
        from phaseprof.cli.capture import capture

        return capture(args.logdir, run=args.run, steps=args.steps, ranks=args.ranks, wait=args.wait,
                       timeout=args.timeout)
    if args.command == "upload":
        from phaseprof.cli.upload import upload as upload_run

        return upload_run(args.staging, args.url)
    from phaseprof.training_hooks.demo import run_demo

    return run_demo(logdir=args.logdir, steps=args.steps, device=args.device)


def _report(args: argparse.Namespace) -> int:
    from phaseprof.cli.report import report as make_report

    progress = _ProgressBar() if sys.stderr.isatty() else None
    try:
        report = make_report(args.path, run=args.run, step=args.step, kernels=args.kernels,
                             modules=args.modules, collectives=args.collectives, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    if args.kernels:
        from phaseprof.plugin.analysis.kernels import sort_kernels

        for w in (w for r in report.runs for w in r.workers if w.kernels is not None):
            w.kernels.kernels = sort_kernels(w.kernels.kernels, args.sort)
    readable = any(r.workers or r.whole_run for r in report.runs)
    if args.json:
        import msgspec

        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(report), indent=1) + b"\n")
        sys.stdout.flush()
    else:
        from rich.console import Console

        from phaseprof.cli.terminal import render

        render(report, Console(), evidence=args.evidence)
    gc.freeze()  # the process ends now: spare the interpreter's final pass over every object
    return 0 if readable else 1


def _compare(args: argparse.Namespace) -> int:
    import msgspec

    from phaseprof.cli.compare import UnusableInput, compare_paths

    if not 0 < args.confidence < 1:
        print(f"phaseprof compare: --confidence must lie between 0 and 1, not {args.confidence}", file=sys.stderr)
        return 2
    try:
        result = compare_paths(args.base, args.new, threshold=args.threshold, confidence=args.confidence,
                               min_share=args.min_share, source=args.source)
    except UnusableInput as e:
        if args.json:
            sys.stdout.buffer.write(msgspec.json.encode({"errors": [{"path": e.path, "error": e.reason}]}) + b"\n")
        from phaseprof.cli.terminal import shown

        print(f"phaseprof compare: {shown(str(e))}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(result), indent=1) + b"\n")
        sys.stdout.flush()
    else:
        from rich.console import Console

        from phaseprof.cli.compare_table import render

        render(result, Console())
    return 1 if result.slower else 0


def _ranks(text: str) -> list[int] | None:
    """``all`` (None), or ranks as ``0,3``."""
    if text == "all":
        return None
    try:
        ranks = sorted({int(r) for r in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not 'all' nor ranks like 0,3: {text!r}") from None
    if any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"ranks are not negative: {text!r}")
    return ranks


def _share(text: str) -> float:
    """A fraction, given as ``0.05`` or ``5%``."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0 or (value >= 1 and not text.endswith("%")):
        raise argparse.ArgumentTypeError(f"{text!r}: give a fraction (0.05) or a percentage (5%)")
    return value


class _ProgressBar:
    """A transient progress bar on stderr while large traces are read (only on a terminal).

    It redraws only between files, with no thread of its own: a large file is decoded by two
    processes, and forking is only safe while this process runs a single thread."""

    #: Below this much to read, no bar.
    MIN_BYTES = 4 << 20

    def __init__(self) -> None:
        self._progress = None
        self._task = None

    def start(self, files) -> None:
        total = sum(f.size for f in files)
        if total < self.MIN_BYTES:
            return
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                                  console=Console(stderr=True), transient=True, auto_refresh=False)
        self._progress.start()
        self._task = self._progress.add_task("reading", total=total)
        self._progress.refresh()

    def reading(self, f) -> None:
        if self._progress is not None:
            from rich.markup import escape

            from phaseprof.cli.terminal import shown

            self._progress.update(self._task, description=f"reading {escape(shown(f.name))}")
            self._progress.refresh()

    def read(self, f) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=f.size)
            self._progress.refresh()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()

