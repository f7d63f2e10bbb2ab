"""A training job that runs until told to stop, for the capture tests: a small model under
PhaseProfiler, each step a sleep of ``step_s`` (so its pace holds on a busy machine), optionally a
slowdown from step ``slow_from`` on (a sleep in forward), optionally as one rank of a torchrun job,
with its logdir on disk or in a store (``logdir="s3://…"``).

The job says where it is through files in ``events/`` (never by timing): ``ready.rank<R>`` once
it has run ``ready_at`` steps, ``starts.rank<R>.json`` at the end (each step's number and start
time); it stops when ``events/stop`` appears (at the next step, every rank together) or after
``max_steps``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from phaseprof.capture_store import POLL_ENV
from tests.processes import kill_tree

#: Seconds between two looks of a job's watcher at a channel in a store.
POLL_S = 0.5

SCRIPT = r'''
import atexit, json, os, sys, time
import torch
from torch import nn
from phaseprof import PhaseProfiler

cfg = json.loads(sys.argv[1])
events = cfg["events"]
torch.set_num_threads(1)
torch.manual_seed(0)
distributed = cfg.get("distributed", False)
rank = 0
if distributed:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        self.step = 0

    def forward(self, x):
        if cfg.get("slow_from") is not None and self.step >= cfg["slow_from"]:
            time.sleep(cfg["slow_s"])  # the injected slowdown
        return self.body(x)


net = Net()
model = torch.nn.parallel.DistributedDataParallel(net) if distributed else net
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
starts = []
stop = os.path.join(events, "stop")
with PhaseProfiler(logdir=cfg["logdir"], run=cfg["run"], wait=1, warmup=1, active=cfg["active"],
                   capture_on_slowdown=cfg.get("slowdown", False)) as prof:
    prof.attach(model, optimizer)
    while prof.step_num < cfg["max_steps"]:
        flag = torch.tensor([float(os.path.exists(stop))])
        if distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if flag.item():
            break
        net.step = prof.step_num
        starts.append((prof.step_num, time.time()))
        optimizer.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        time.sleep(cfg["step_s"])
        optimizer.step()
        if prof.step_num == cfg["ready_at"]:
            open(os.path.join(events, f"ready.rank{rank}"), "w").close()
with open(os.path.join(events, f"starts.rank{rank}.json"), "w") as fh:
    json.dump(starts, fh)
if distributed:
    dist.barrier()
# The profiler closed with the block above; the exit handlers run, then the process ends without
# the interpreter's finalization (seconds of tearing torch's modules down on a busy machine; and
# torch's gloo group sometimes aborts in it)
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


class Job:
    """The job as a subprocess (``ranks`` > 1: under torchrun)."""

    def __init__(self, tmp: Path, run: str = "long", *, ranks: int = 1, step_s: float = 0.02, active: int = 5,
                 max_steps: int = 100_000, ready_at: int = 20, slow_from: int | None = None, slow_s: float = 0.0,
                 slowdown: bool = False, logdir: Path | str | None = None):
        self.tmp = tmp
        self.logdir = logdir or tmp / "profile"
        #: a logdir in a store (a URL): the run is staged under ``tmp/staging`` and uploaded there
        self.remote = isinstance(self.logdir, str)
        self.run_dir = f"{self.logdir}/{run}" if self.remote else self.logdir / run
        self.events = tmp / f"events-{run}"
        self.events.mkdir(parents=True)
        script = tmp / "job.py"
        script.write_text(SCRIPT)
        cfg = dict(logdir=str(self.logdir), run=run, events=str(self.events), step_s=step_s, active=active,
                   max_steps=max_steps, ready_at=ready_at, slow_from=slow_from, slow_s=slow_s, slowdown=slowdown,
                   distributed=ranks > 1)
        self.ranks = ranks
        launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
                    if ranks > 1 else [sys.executable])
        self.stdout = open(tmp / f"job-{run}.log", "w+")  # noqa: SIM115 - closed by finish()
        env = dict(os.environ)
        if self.remote:
            (tmp / "staging").mkdir(exist_ok=True)
            env["PHASEPROF_STAGING"] = str(tmp / "staging")
            # its watcher looks at the store's channel every POLL_S (not every 3 s): its heartbeat
            # says so, and the asker's lead follows (what is proved does not change, only the wait)
            env[POLL_ENV] = str(POLL_S)
        self.proc = subprocess.Popen([*launcher, str(script), json.dumps(cfg)], stdout=self.stdout,
                                     stderr=subprocess.STDOUT, text=True, env=env)

    def wait_for(self, name: str, timeout: float = 300) -> None:
        """Until ``events/<name>`` exists; fails if the job ends first or the deadline passes."""
        deadline = time.monotonic() + timeout
        while not (self.events / name).exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended before {name}: {self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {name} within {timeout} s: {self.log()[-3000:]}")
            time.sleep(0.1)

    def ready(self) -> None:
        for rank in range(self.ranks):
            self.wait_for(f"ready.rank{rank}")

    def finish(self, timeout: float = 300) -> str:
        """Stop the job, wait for it, and return its output; fails unless it exited cleanly."""
        (self.events / "stop").touch()
        code = self.proc.wait(timeout=timeout)
        log = self.log()
        self.stdout.close()
        assert code == 0, log[-3000:]
        return log

    def starts(self, rank: int = 0) -> dict[int, float]:
        """Each step's start time (seconds since the epoch), by step number."""
        return dict(json.loads((self.events / f"starts.rank{rank}.json").read_text()))

    def log(self) -> str:
        self.stdout.flush()
        return Path(self.stdout.name).read_text()

    def kill(self) -> None:
        """Kill the job: the torchrun agent and its ranks (each in a session of its own), not the
        agent alone, which leaves the ranks running."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        self.proc.wait()
        if not self.stdout.closed:
            self.stdout.close()


def capture(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``phaseprof capture ARGS`` in a subprocess, as a user runs it."""
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "phaseprof.cli", "capture", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def capture_here(capsys, *args: str) -> subprocess.CompletedProcess:
    """``phaseprof capture ARGS`` in this process (``capsys``: pytest's fixture), for a call whose
    own process would spend seconds importing what this one has."""
    from phaseprof.cli import main

    capsys.readouterr()
    code = main(["capture", *args])
    said = capsys.readouterr()
    return subprocess.CompletedProcess(["phaseprof", "capture", *args], code, said.out, said.err)
