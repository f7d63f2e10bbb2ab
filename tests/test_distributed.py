"""Distributed training for real: `torchrun` with two processes (gloo, CPU), DDP, one PhaseProfiler
per rank writing into one run; then the report and the rank comparison read it back."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import msgspec
import pytest

from phaseprof import analyze
from phaseprof.contract import TRACE_FILE_RE
from phaseprof.plugin.analysis.ranks import ranks
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.spans import analyze_file

pytestmark = pytest.mark.slow

TRAIN = textwrap.dedent("""
    import sys, time
    import torch, torch.distributed as dist, torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from phaseprof import PhaseProfiler

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def batches():
        for _ in range(8):
            if rank == 1:
                time.sleep(0.02)  # rank 1 loads its data slowly: the straggler
            yield torch.randn(32, 64), torch.randint(0, 10, (32,))

    with PhaseProfiler(logdir=sys.argv[1], run="ddp", wait=1, warmup=1, active=5) as prof:
        prof.attach(model, optimizer)
        for data, target in prof.data(batches()):
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
    dist.destroy_process_group()
""")


def test_two_ranks_under_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    logdir = tmp_path / "profile"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
               str(logdir)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]

    traces = sorted(p.name for p in (logdir / "ddp").glob("*.pt.trace.json.gz"))
    workers = sorted(TRACE_FILE_RE.match(name)["worker"] for name in traces)
    assert [w.split(".")[0] for w in workers] == ["rank0", "rank1"]  # one span per rank, names distinct
    # every rank's scalars, each in a TensorBoard run of its own
    assert not list((logdir / "ddp").glob("events.out.tfevents.*"))
    for rank in (0, 1):
        assert len(list((logdir / "ddp" / f"rank{rank}").glob("events.out.tfevents.*"))) == 1

    report = analyze(str(logdir))
    (ddp,) = report["runs"]
    assert report["errors"] == []
    assert sorted(w["rank"] for w in ddp["workers"]) == [0, 1]
    # the whole run of each rank, from its scalars: rank 1 waits on its data every step
    whole = {w["rank"]: {p["phase"]: p for p in w["phases"] if p["clock"] == "host"} for w in ddp["whole_run"]}
    assert sorted(whole) == [0, 1] and all(w["step"]["steps"] == 7 for w in whole.values())  # 8 but the first
    assert whole[1]["data"]["median_ms"] > whole[0]["data"]["median_ms"] + 15
    for worker in ddp["workers"]:
        assert worker["world_size"] == 2
        assert [s["step"] for s in worker["steps"]] == [2, 3, 4, 5, 6]  # five: a straggler is judged from five
        for s in worker["steps"]:
            assert not s["inferred"]
            assert all(s["phases"][p]["host_ms"] > 0 for p in ("data", "forward", "backward", "optimizer"))

    (found,) = discover(str(logdir))
    table = msgspec.json.decode(msgspec.json.encode(ranks(found.name, [Worker(w, [analyze_file(f) for f in files])
                                                   for w, files in found.workers.items()])))
    by_rank = {r["rank"]: r for r in table["ranks"]}
    assert by_rank[0]["comm_ms"] > by_rank[1]["comm_ms"] + 10  # rank 0 waits for rank 1 in all_reduce
    straggler = table["straggler"]
    assert straggler["rank"] == 1 and straggler["waited_for"]
    assert straggler["phase"] == "data" and straggler["phase_behind_ms"] > 15
