"""Fault injection, in the spirit of Jepsen's checks: real training processes write a run to
``s3://`` through a `FaultRelay` in front of the real S3 server (`tests.s3`) while faults are
injected: refused connections, black holes, 500 answers, slow answers, the bucket deleted and given
back, SIGKILL of the training process or of its uploader at a random point, a full disk (a small
tmpfs as the staging folder) and fork children (a ``fork`` Pool, terminated). The training script
appends every file it finished writing to a manifest; after each run, what is in the store plus
what is left staged is compared with it: files lost and files duplicated (one file under two keys, a
trace both compressed and not) must both be 0. What a fault leaves staged is then uploaded with the
command the run names (``phaseprof upload``), and must all reach the store.

The quick variant (a handful of faults) runs in the default suite; the thorough one injects at
least 200 faults and prints a table:
``PHASEPROF_FAULTS=thorough python -m pytest tests/test_fault_injection.py``.
Every random choice comes from one seed, printed (and in every failure's message); replay a run with
``PHASEPROF_FAULTS_SEED=<seed>``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from phaseprof.contract import EVENT_FILE_MARKER, TRACE_FILE_RE
from tests.fault_relay import BucketOutage, FaultRelay

#: PHASEPROF_FAULTS=thorough: 200 faults and more, over runs that each take many.
THOROUGH = os.environ.get("PHASEPROF_FAULTS") == "thorough"
SEED = int(os.environ.get("PHASEPROF_FAULTS_SEED") or random.SystemRandom().randrange(1 << 32))
#: The faults switched on and off while a run goes on.
NETWORK = ("refuse", "black_hole", "error_500", "slow", "bucket_deleted")
#: How the thorough variant's runs end, in turn (each a fault but "close"): the kills twice as often
#: (the training process once while the store is down: its orphaned uploader cannot finish); the
#: store down at close refusing, black-holing or answering 500 (each costs close() its whole bound).
_TURNS = (
    "close",
    "kill_training",
    "kill_uploader",
    "fork",
    "bucket_missing_at_close",
    "kill_training_while_down",
    "kill_uploader",
    "down_at_close",
)
#: Generous deadlines (a loaded machine): never a measure, only how long a wait may last.
DEADLINE_S = 300
RUN = "r"

TRAIN = textwrap.dedent("""
    import json, multiprocessing, os, sys, time, warnings
    import torch
    from phaseprof import PhaseProfiler

    url, markers, staging, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    manifest = open(os.path.join(markers, "manifest"), "a")
    recorded = {}

    def record():
        # every file of this run finished in staging, once (scalars again whenever they grew)
        for directory, _, names in os.walk(staging):
            for name in names:
                parts = os.path.relpath(os.path.join(directory, name), staging).split(os.sep)
                if len(parts) < 3 or parts[1] != "r" or name.endswith((".part", ".tmp")):
                    continue
                key = "/".join(parts[2:])
                try:
                    size = os.path.getsize(os.path.join(directory, name))
                except OSError:
                    continue
                if recorded.get(key, -1) < size and (key not in recorded or ".tfevents." in name):
                    recorded[key] = size
                    manifest.write(f"{size} {key}\\n")
                    manifest.flush()

    def mark(name):
        open(os.path.join(markers, name), "w").close()

    def marked(name):
        return os.path.exists(os.path.join(markers, name))

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    cycle = options["cycle"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = PhaseProfiler(logdir=url, run="r", wait=cycle - 2, warmup=1, active=1, repeat=0,
                             gzip=options["gzip"])
        prof.attach(model, optimizer)
        forked = False
        # until told to stop, and then to the end of the cycle: close() writes no trace of its own
        while not marked("stop") or prof.step_num % cycle:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
            time.sleep(options["pace_s"])
            record()
            if prof.step_num == 3:
                mark("started")
            # children that inherit the profiler, ended by SIGTERM
            if marked("fork") and not forked:
                forked = True
                pool = multiprocessing.get_context("fork").Pool(2)
                pool.map(abs, range(8))
                pool.map_async(time.sleep, [30, 30])  # busy children get the SIGTERM
                time.sleep(0.5)
                pool.terminate()
                pool.join()
                mark("forked")
        # the traces being compressed, recorded before close() (on a full disk they may never be)
        deadline = time.monotonic() + (0 if options["full_disk"] else 300)
        while any(n.endswith(".part") for _, _, names in os.walk(staging) for n in names):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        record()
        mark("closing")
        prof.close()
    manifest.close()
    print(json.dumps([str(w.message) for w in caught if str(w.message).startswith("phaseprof")]))
""")


@dataclass
class Tally:
    """What the faults of one kind did, summed over runs."""

    injected: int = 0
    written: int = 0
    lost: int = 0
    duplicated: int = 0


@dataclass
class Plan:
    """One training run: the network faults injected while it goes on (in order), how it ends, and
    whether its staging folder is a small full tmpfs."""

    seed: int
    network: list[str]
    ending: str
    full_disk: bool = False
    gzip: bool = True
    log: list[str] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return (
            self.network
            + ([self.ending] if self.ending != "close" else [])
            + (["full_disk"] if self.full_disk else [])
        )


# -- the check -----------------------------------------------------------------------------------


def _manifest(markers: Path) -> dict[str, int]:
    """What the run finished writing: key under the run -> the largest size seen."""
    written: dict[str, int] = {}
    path = markers / "manifest"
    for line in path.read_text().splitlines(keepends=True) if path.exists() else []:
        if line.endswith("\n"):  # a last line cut by SIGKILL is no record
            size, _, key = line.strip().partition(" ")
            written[key] = max(written.get(key, 0), int(size))
    return written


def _staged(staging: Path) -> dict[str, int]:
    """What is left in staging folders: key under the run -> size."""
    out = {}
    for path in staging.rglob("*"):
        parts = path.relative_to(staging).parts
        if path.is_file() and len(parts) >= 3 and parts[1] == RUN:
            out["/".join(parts[2:])] = path.stat().st_size
    return out


def _stored(s3, bucket: str) -> dict[str, int]:
    """Every object of the bucket: key -> size."""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def _is_scalars(key: str) -> bool:
    return EVENT_FILE_MARKER in key.rpartition("/")[2]


def _whole(key: str, size: int, found: int | None) -> bool:
    """Whether a copy of ``found`` bytes keeps ``key``, seen written at ``size`` (0: any)."""
    return found is not None and (found >= size if _is_scalars(key) or size == 0 else found == size)


def count(
    written: dict[str, int],
    stored: dict[str, int],
    staged: dict[str, int],
    prefix: str,
    analyses_due: bool,
) -> tuple[int, int, int, list[str]]:
    """Files written, lost and duplicated, and a line for each loss or duplicate. A file is kept if
    the store or staging holds it whole (scalars: at least as much as was seen written); with
    ``analyses_due`` (a run that closed, able to write), every trace's analysis is due too."""
    expected = dict(written)
    if analyses_due:
        for key in list(written):
            name = key.rpartition("/")[2]
            if TRACE_FILE_RE.match(name) and "/" not in key:
                expected.setdefault(f".phaseprof/{name}.analysis", 0)
    problems = []
    lost = 0
    for key, size in sorted(expected.items()):
        if not _whole(key, size, stored.get(prefix + key)) and not _whole(
            key, size, staged.get(key)
        ):
            lost += 1
            problems.append(
                f"lost {key} ({size} bytes written; stored {stored.get(prefix + key)}, "
                f"staged {staged.get(key)})"
            )
    # the same file twice: under two keys (another folder), a trace both compressed and not, or a
    # key outside the run
    names = collections.Counter()
    for key in stored:
        if not key.startswith(prefix):
            problems.append(f"duplicated: {key} is outside {prefix}")
            names[key] += 2
            continue
        name = key.rpartition("/")[
            2
        ]  # a run's file names are unique: the same one twice is one file twice
        names[name.removesuffix(".gz") if TRACE_FILE_RE.match(name) else name] += 1
    duplicated = sum(n - 1 for n in names.values() if n > 1)
    problems += [f"duplicated {name} ({n} keys)" for name, n in names.items() if n > 1]
    return len(expected), lost, duplicated, problems


# -- a run under faults ----------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()  # state, ppid, pgrp...
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _uploaders(pid: int) -> list[int]:
    """The uploader processes the training process ``pid`` started."""
    out = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            children = [int(c) for c in fh.read().split()]
    except OSError:
        return []
    for child in children:
        with contextlib.suppress(OSError), open(f"/proc/{child}/cmdline", "rb") as fh:
            if b"phaseprof.training_hooks.upload" in fh.read():
                out.append(child)
    return out


def _wait(condition, what: str, run: Run | None = None, deadline_s: float = DEADLINE_S) -> None:
    """Wait for ``condition`` (failing if ``run``'s training process ends first)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if run is not None and run.proc.poll() is not None:
            raise AssertionError(
                f"the training process ended ({run.proc.returncode}) before {what}: "
                f"{run.read()[1][-3000:]}"
            )
        assert time.monotonic() < deadline, f"{what}: not within {deadline_s} s"
        time.sleep(0.05)


def _free(path: Path) -> int:
    """Bytes free on the disk of ``path``."""
    disk = os.statvfs(path)
    return disk.f_bavail * disk.f_frsize


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    """A small tmpfs mounted at ``path`` (the disk that fills up), unmounted afterwards."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


class Run:
    """One training process writing ``s3://<bucket>/p/r`` through ``relay``; every process it
    starts (the uploader, fork children) is in its process group, killed by `stop`."""

    def __init__(
        self, s3, bucket: str, relay: FaultRelay, tmp: Path, plan: Plan, staging: Path
    ) -> None:
        self.s3, self.bucket, self.relay, self.plan = s3, bucket, relay, plan
        self.url = f"s3://{bucket}/p"
        self.markers, self.staging, self.work = tmp / "markers", staging, tmp / "work"
        for d in (self.markers, self.work):
            d.mkdir()
        env = {
            **os.environ,
            "PHASEPROF_STAGING": str(staging),
            "AWS_ENDPOINT_URL": relay.endpoint,
            "S3_ENDPOINT": relay.endpoint,
        }
        env.pop("PHASEPROF_CACHE", None)  # analyses are written, as in a user's run
        options = {"cycle": 12, "pace_s": 0.05, "gzip": plan.gzip, "full_disk": plan.full_disk}
        # its output to files: a pipe nobody reads until the end could fill and stall the run
        with open(tmp / "out", "w") as out, open(tmp / "err", "w") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    TRAIN,
                    self.url,
                    str(self.markers),
                    str(staging),
                    json.dumps(options),
                ],
                cwd=self.work,
                env=env,
                stdout=out,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self._output = tmp
        self.out = self.err = ""
        self.began = time.monotonic()

    def marked(self, name: str) -> bool:
        return (self.markers / name).exists()

    def mark(self, name: str) -> None:
        (self.markers / name).touch()

    def disk_full(self) -> bool:
        """Whether the run stages on a full disk (no room for a trace)."""
        return self.plan.full_disk and _free(self.staging) < 12 << 10

    def files(self) -> int:
        return len(_manifest(self.markers))

    def finish(self) -> int:
        """Wait for the training process to end; its exit code."""
        try:
            self.proc.wait(timeout=2 * DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(
                f"the training process did not end within {2 * DEADLINE_S} s "
                f"(seed {self.plan.seed}; {self.plan.log}): {self.read()[1][-2000:]}"
            ) from None
        finally:
            self.out, self.err = self.read()
        return self.proc.returncode

    def read(self) -> tuple[str, str]:
        """What the training process printed so far: its output, its errors."""
        return (self._output / "out").read_text(), (self._output / "err").read_text()

    def stop(self) -> None:
        """Kill every process of the run (the training process, its uploader, analyses, fork
        children) and wait until none is left."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        _wait(
            lambda: not _group(self.proc.pid),
            f"the processes of group {self.proc.pid} gone",
            deadline_s=60,
        )


def _network_fault(run: Run, kind: str, rng: random.Random) -> None:
    """Inject one fault while the run goes on, until the uploader met it (and a random while)."""
    relay = run.relay
    if kind == "bucket_deleted":
        outage = _take_bucket(run)
        seen = len(relay.requests)
        _wait(lambda: len(relay.requests) > seen, "a request to the deleted bucket", run)
        time.sleep(rng.uniform(0, 2))
        _give_bucket_back(run, outage)
        return
    seen = relay.hits[kind]
    relay.set_mode(kind)
    if kind == "refuse":  # no connection is seen: long enough for a pass of the uploader or two
        time.sleep(rng.uniform(1.5, 4))
    else:
        if not relay.wait_for_hit(kind, seen):
            run.plan.log.append(f"{kind}: no connection came while it lasted")
        time.sleep(rng.uniform(0, 1))
    relay.set_mode("pass")


def _take_bucket(run: Run) -> BucketOutage:
    outage = BucketOutage(run.s3.client(), run.bucket)
    run.relay.set_mode("pause")  # nothing lands while the objects are put aside
    try:
        outage.take()
    finally:
        run.relay.set_mode("pass")
    return outage


def _give_bucket_back(run: Run, outage: BucketOutage) -> None:
    run.relay.set_mode("pause")  # no upload races the objects put back
    try:
        outage.give_back()
    finally:
        run.relay.set_mode("pass")


def _kill(pid: int, rng: random.Random, run: Run, what: str) -> None:
    """SIGKILL ``pid`` at a random point: once the run finished a random number of files, and a
    random while later."""
    files = rng.randint(1, 4)
    _wait(
        lambda: run.files() >= files or run.disk_full(),
        f"{files} files written before killing the {what}",
        run,
    )
    time.sleep(rng.uniform(0, 3))
    run.plan.log.append(f"SIGKILL {what} after {run.files()} files")
    os.kill(pid, signal.SIGKILL)


def _upload_commands(run: Run) -> list[list[str]]:
    """The ``phaseprof upload`` arguments the run's summary named for what it left staged, or, for
    a run killed before it could say, each staging folder to the logdir (as the summary would)."""
    for line in run.out.splitlines():
        if "phaseprof upload " in line:
            return [shlex.split(line[line.index("phaseprof upload ") :])[2:4]]
    if run.proc.returncode == 0:
        return []
    return [[str(root), run.url] for root in sorted(run.staging.iterdir())]


def _upload(args: list[str]) -> subprocess.CompletedProcess:
    """``phaseprof upload ARGS``, its process group killed if it outlives the deadline."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "phaseprof.cli", "upload", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=DEADLINE_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def play(s3, bucket: str, tmp: Path, plan: Plan, tallies: dict[str, Tally]) -> None:
    """Run ``plan``'s training under its faults, check the store and staging against the manifest,
    upload what is left, check again; add to ``tallies``; raise on a file lost or duplicated."""
    rng = random.Random(plan.seed)
    relay = FaultRelay(s3.port, delay_s=rng.uniform(0.2, 1.5))
    staging = tmp / "staging"
    disk = _tmpfs(staging, "64k") if plan.full_disk else contextlib.nullcontext(staging.mkdir())
    with disk:
        run = Run(s3, bucket, relay, tmp, plan, staging)
        try:
            _play(run, rng)
        finally:
            run.stop()
            relay.close()
        written = _manifest(run.markers)
        closed = run.proc.returncode == 0
        prefix = f"p/{RUN}/"
        total, lost, duplicated, problems = count(
            written,
            _stored(s3, bucket),
            _staged(staging),
            prefix,
            analyses_due=closed and not plan.full_disk,
        )
        left = _staged(staging)
        if left:  # what a fault left staged goes up with the command the run named
            commands = _upload_commands(run)
            if not commands:
                problems.append(
                    "files were left staged and the summary named no command that uploads them"
                )
            for args in commands:
                upload = _upload(args)
                plan.log.append(
                    f"phaseprof upload {' '.join(args)}: exit {upload.returncode} "
                    f"{upload.stdout.strip()[-500:]}"
                )
                if upload.returncode != 0:
                    problems.append(f"phaseprof upload {' '.join(args)} exited {upload.returncode}")
            _, lost_after, duplicated_after, after = count(
                written, _stored(s3, bucket), {}, prefix, analyses_due=closed and not plan.full_disk
            )
            lost, duplicated = max(lost, lost_after), max(duplicated, duplicated_after)
            problems += [f"after phaseprof upload: {p}" for p in after]
    for kind in plan.kinds():
        tallies.setdefault(kind, Tally()).injected += 1
    for kind in set(plan.kinds()) or {"none"}:
        t = tallies.setdefault(kind, Tally())
        t.written, t.lost, t.duplicated = (
            t.written + total,
            t.lost + lost,
            t.duplicated + duplicated,
        )
    assert not problems, (
        f"seed {plan.seed} ({plan.kinds()}; {plan.log}): {problems}; "
        f"exit {run.proc.returncode}, out {run.out[-1500:]}, err {run.err[-1500:]}"
    )


def _play(run: Run, rng: random.Random) -> None:
    plan = run.plan
    _wait(lambda: run.marked("started"), "the run started", run)
    uploader = _uploaders(run.proc.pid)
    if plan.ending == "kill_uploader":
        assert uploader, "no uploader process"
    for kind in plan.network:
        plan.log.append(f"{kind} after {run.files()} files, {time.monotonic() - run.began:.0f} s")
        _network_fault(run, kind, rng)
    if plan.ending.startswith("kill_training"):
        down = plan.ending.endswith("_while_down")
        if down:  # the orphaned uploader finds the store down, and gives up after its bound
            run.relay.set_mode(rng.choice(("refuse", "black_hole", "error_500")))
            plan.log.append(f"the store: {run.relay.mode}")
        _kill(run.proc.pid, rng, run, "training process")
        run.finish()
        for pid in uploader:  # left alone, the uploader uploads what is staged, then ends
            _wait(lambda pid=pid: not _alive(pid), "the orphaned uploader ended")
        run.relay.set_mode("pass")
        return
    if plan.ending == "kill_uploader":
        _kill(uploader[0], rng, run, "uploader")
    if plan.ending == "fork":
        run.mark("fork")
        _wait(
            lambda: run.marked("forked"), "the fork children were terminated", run, deadline_s=120
        )
    _wait(lambda: run.files() >= 2 or run.disk_full(), "two files written", run)
    if plan.full_disk:  # the run goes on a while with its disk full
        _wait(run.disk_full, "the staging disk full", run)
        plan.log.append(f"disk full after {run.files()} files")
        time.sleep(rng.uniform(1, 3))
    outage = _take_bucket(run) if plan.ending == "bucket_missing_at_close" else None
    down = (
        plan.ending.removesuffix("_at_close")
        if plan.ending.endswith("_at_close") and not outage
        else None
    )
    if down:  # the store does not answer while the run closes (close() gives up after its bound)
        run.relay.set_mode(down)
    run.mark("stop")
    assert run.finish() == 0, run.err[-3000:]
    if outage is not None:
        outage.give_back()
    if down:
        run.relay.set_mode("pass")


def _table(tallies: dict[str, Tally]) -> str:
    rows = [f"{'fault':<24}{'injected':>9}{'files written':>15}{'lost':>6}{'duplicated':>12}"]
    for kind, t in sorted(tallies.items()):
        rows.append(f"{kind:<24}{t.injected:>9}{t.written:>15}{t.lost:>6}{t.duplicated:>12}")
    total = sum(t.injected for t in tallies.values())
    rows.append(f"{'all':<24}{total:>9}  (seed {SEED})")
    return "\n".join(rows)


# -- the quick variant: four runs, every fault once -------------------------------

QUICK = [
    Plan(SEED, list(NETWORK), "fork", gzip=False),  # the analyses of plain JSON traces too
    Plan(SEED + 1, [], "kill_training"),
    Plan(SEED + 2, [], "kill_uploader", full_disk=True),
    Plan(SEED + 3, [], "bucket_missing_at_close"),
]


def _thorough(rng: random.Random) -> list[Plan]:
    """Runs enough for 200 faults at least: each a random series of network faults, then an ending
    (`_TURNS` in turn), every third on a full disk."""
    plans: list[Plan] = []
    while sum(len(p.kinds()) for p in plans) < 200:
        ending = _TURNS[len(plans) % len(_TURNS)]
        if ending == "down_at_close":  # each way in turn
            ending = ("refuse", "black_hole", "error_500")[
                len(plans) // len(_TURNS) % 3
            ] + "_at_close"
        plans.append(
            Plan(
                rng.randrange(1 << 32),
                [rng.choice(NETWORK) for _ in range(rng.randint(3, 8))],
                ending,
                full_disk=len(plans) % 3 == 2,
                gzip=rng.random() < 0.7,
            )
        )
    return plans


PLANS = _thorough(random.Random(SEED)) if THOROUGH else QUICK
TALLIES: dict[str, Tally] = {}


@pytest.fixture(scope="module")
def table(request):
    """The tally of every run of the module, printed once they are all done."""
    yield TALLIES
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print(f"\n{_table(TALLIES)}", flush=True)


def _name(plan: Plan) -> str:
    return "+".join(plan.kinds()) if not THOROUGH else f"{PLANS.index(plan)}-{plan.ending}"


@pytest.mark.slow
@pytest.mark.parametrize("plan", PLANS, ids=_name)
def test_no_file_is_lost_or_duplicated_under_faults(s3, bucket, tmp_path, plan, table):
    play(s3, bucket, tmp_path, plan, table)


@pytest.mark.slow
def test_the_relay_injects_each_fault_a_client_of_the_store_sees(s3, bucket):
    """Each mode as botocore meets it (no retries, a short read timeout): the faults are real."""
    import boto3
    import botocore.config
    import botocore.exceptions

    relay = FaultRelay(s3.port, delay_s=0.3)
    config = botocore.config.Config(
        retries={"max_attempts": 1, "mode": "standard"}, read_timeout=2, connect_timeout=2
    )
    client = boto3.client("s3", endpoint_url=relay.endpoint, config=config)
    outage = BucketOutage(s3.client(), bucket)
    try:
        client.put_object(Bucket=bucket, Key="k", Body=b"kept")
        relay.set_mode("refuse")
        with pytest.raises(botocore.exceptions.EndpointConnectionError):
            client.head_bucket(Bucket=bucket)
        relay.set_mode("black_hole")
        with pytest.raises(botocore.exceptions.ReadTimeoutError):
            client.head_bucket(Bucket=bucket)
        relay.set_mode("error_500")
        with pytest.raises(botocore.exceptions.ClientError, match="InternalError"):
            client.get_object(Bucket=bucket, Key="k")
        relay.set_mode("slow")
        assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"kept"
        assert min(relay.hits[m] for m in ("black_hole", "error_500", "slow")) >= 1
        relay.set_mode("pause")
        outage.take()
        relay.set_mode("pass")
        with pytest.raises(botocore.exceptions.ClientError, match="NoSuchBucket"):
            client.get_object(Bucket=bucket, Key="k")
        outage.give_back()
        assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"kept"
    finally:
        relay.close()


def test_a_file_is_lost_unless_kept_whole_and_duplicated_under_a_second_name():
    trace, scalars = "w.1.pt.trace.json.gz", "events.out.tfevents.1.w.0"
    written = {trace: 100, scalars: 50, f".phaseprof/{trace}.analysis": 20}
    whole = {f"p/r/{trace}": 100, f"p/r/{scalars}": 60, f"p/r/.phaseprof/{trace}.analysis": 20}
    assert count(written, whole, {}, "p/r/", analyses_due=True) == (3, 0, 0, [])
    # staged only counts as kept; a cut trace, shrunk scalars or a missing analysis as lost
    staged = {trace: 100}
    cut = {f"p/r/{trace}": 99, f"p/r/{scalars}": 49}
    total, lost, duplicated, problems = count(written, cut, staged, "p/r/", analyses_due=True)
    assert (total, lost, duplicated) == (3, 2, 0), problems
    # a trace also stored uncompressed, or under another folder, or a key outside the run
    twice = {**whole, "p/r/w.1.pt.trace.json": 300, f"p/r/r/{scalars}": 60, "p/elsewhere": 1}
    assert count(written, twice, {}, "p/r/", analyses_due=False)[1:3] == (0, 3)
    # a closed run owes each trace's analysis, written or not
    assert count({trace: 100}, {f"p/r/{trace}": 100}, {}, "p/r/", analyses_due=True)[:2] == (2, 1)
