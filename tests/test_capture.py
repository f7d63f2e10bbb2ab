"""Traces of any step of a long run: ``phaseprof capture`` against running jobs (one process, and two
ranks under torchrun), the slowdown trigger, and request files that are not what they should be."""

from __future__ import annotations

import os
import time

import msgspec
import pytest

from phaseprof import analyze
from phaseprof.capture_channel import (
    BY_SLOWDOWN,
    FINAL,
    REFUSED,
    WRITTEN,
    Heartbeat,
    Request,
    capture_dir,
    channel_folder,
    plan_request,
    read_channel,
    request_name,
    write_atomic,
)
from phaseprof.contract import TRACE_FILE_RE
from tests.capture_job import Job, capture, capture_here
from tests.s3 import _buckets as s3_buckets
from tests.stores import STORES

pytestmark = pytest.mark.slow


@pytest.fixture
def logdir(request, tmp_path):
    """The job's logdir (``disk`` unless a test's parameter names a store): a folder, or a prefix in
    a new bucket of a store on the loopback (``s3``, ``gs``, ``az``: `tests.stores`), where the
    channel is objects (`phaseprof.capture_store`)."""
    where = getattr(request, "param", "disk")
    if where == "disk":
        return tmp_path / "profile"
    store, bucket = _new_bucket(request, where)
    return store.url(bucket, "profile")


def _new_bucket(request, where: str):
    """The store ``where`` names (started for the session) and a new empty bucket in it."""
    store = request.getfixturevalue(STORES[where])
    bucket = f"logs{next(s3_buckets)}"
    store.create_bucket(bucket)
    return store, bucket


def _answers(run_dir, request_id: str) -> dict:
    return read_channel(str(run_dir)).answers[request_id]


def _request_id(output: str) -> str:
    return output.rsplit("(request ", 1)[1].split(")")[0]


def _traced_steps(logdir, run: str) -> dict[str, list[int]]:
    """Each worker's traced steps, as ``phaseprof report --json`` prints them (`analyze`: here, not
    in a process of its own, which would spend seconds importing what this one has)."""
    report = analyze(str(logdir), run)
    assert report["errors"] == [], report["errors"]
    (found,) = report["runs"]
    return {w["worker"]: [s["step"] for s in w["steps"]] for w in found["workers"]}


@pytest.mark.parametrize("logdir", ["disk", "s3", "gs", "az"], indirect=True)
def test_a_running_job_traces_the_steps_asked_after_the_request(tmp_path, logdir, capsys):
    job = Job(tmp_path, active=5, logdir=logdir)
    try:
        job.ready()
        asked = capture(str(job.logdir), "--steps", "3", "--wait")
        assert asked.returncode == 0, asked.stderr + asked.stdout
        request = read_channel(str(job.run_dir)).requests[-1]
        (answer,) = _answers(job.run_dir, request.id).values()
        assert answer.state == WRITTEN and answer.last - answer.first + 1 == 3
        assert "3 steps analysed" in asked.stdout
        log = job.finish()
    finally:
        job.kill()
    # the first traced step began after the request was written
    assert job.starts()[answer.first] > request.written
    (trace,) = answer.files
    worker = TRACE_FILE_RE.match(trace)["worker"]
    steps = _traced_steps(job.logdir, "long")[worker]
    # the configured window (steps 2-6), then exactly the three steps asked
    assert steps == [2, 3, 4, 5, 6, answer.first, answer.first + 1, answer.first + 2]
    assert "Traceback" not in log

    # the run has ended: asked again, it refuses and says why
    again = capture_here(capsys, str(job.logdir), "--run", "long", "--steps", "3")
    assert again.returncode == 1
    assert "the run ended at step" in again.stderr


def test_a_capture_is_never_longer_than_the_configured_window(tmp_path):
    job = Job(tmp_path, active=4)
    try:
        job.ready()
        asked = capture(str(job.logdir), "--run", "long", "--steps", "50", "--wait")
        assert asked.returncode == 0, asked.stderr + asked.stdout
        (answer,) = _answers(job.run_dir, _request_id(asked.stdout)).values()
        assert answer.last - answer.first + 1 == 4
        assert "configured window" in answer.reason

        # asked for a step already past: a single process starts late, and says both things
        start = answer.last + 2  # its warm-up step is past the last capture
        _wait_for_step(job, start + 1)
        late = Request(id="a" * 16, written=time.time(), by="cli", steps=50, start=start)
        with channel_folder(str(job.run_dir)) as folder:
            write_atomic(folder, request_name(late.id), msgspec.json.encode(late))
        late_answer = _final_answer(job, late.id)
        assert late_answer.state == WRITTEN and late_answer.last - late_answer.first + 1 == 4
        assert late_answer.first > late.start
        assert "configured window" in late_answer.reason and "seen late" in late_answer.reason
        job.finish()
    finally:
        job.kill()


def _wait_for_step(job: Job, step: int, timeout: float = 300) -> None:
    """Until rank 0's heartbeat says it is past ``step``."""
    deadline = time.monotonic() + timeout
    while (beat := read_channel(str(job.run_dir)).beats.get(0)) is None or beat.step <= step:
        assert time.monotonic() < deadline and job.proc.poll() is None, job.log()[-3000:]
        time.sleep(0.1)


def _final_answer(job: Job, request_id: str, timeout: float = 300):
    """Rank 0's answer to a request once it is final, waiting on the channel's files."""
    deadline = time.monotonic() + timeout
    while True:
        answer = read_channel(str(job.run_dir)).answers.get(request_id, {}).get(0)
        if answer is not None and answer.state in FINAL:
            return answer
        assert time.monotonic() < deadline and job.proc.poll() is None, job.log()[-3000:]
        time.sleep(0.1)


@pytest.mark.parametrize("logdir", ["disk", "s3", "az"], indirect=True)  # (gs: as az, 40 s more)
def test_two_ranks_trace_the_same_steps(tmp_path, logdir):
    job = Job(tmp_path, ranks=2, active=5, step_s=0.02, logdir=logdir)
    try:
        job.ready()
        asked = capture(str(job.logdir), "--steps", "4", "--wait")
        assert asked.returncode == 0, asked.stderr + asked.stdout + job.log()[-2000:]
        answers = _answers(job.run_dir, _request_id(asked.stdout))
        job.finish()
    finally:
        job.kill()
    assert sorted(answers) == [0, 1]
    assert {(a.state, a.first, a.last) for a in answers.values()} == {(WRITTEN, answers[0].first, answers[0].first + 3)}
    traced = _traced_steps(job.logdir, "long")
    captured = {answers[rank].files[0] for rank in answers}
    by_worker = {TRACE_FILE_RE.match(name)["worker"] for name in captured}
    assert sorted(w.split(".")[0] for w in by_worker) == ["rank0", "rank1"]
    first = answers[0].first
    for worker in by_worker:
        assert traced[worker][-4:] == [first, first + 1, first + 2, first + 3]
    assert job.starts(0)[first] > read_channel(str(job.run_dir)).requests[-1].written


def test_only_the_ranks_asked_trace(tmp_path):
    job = Job(tmp_path, ranks=2, active=3, step_s=0.02)
    try:
        job.ready()
        asked = capture(str(job.logdir), "--ranks", "1", "--wait")
        assert asked.returncode == 0, asked.stderr + asked.stdout
        answers = _answers(job.run_dir, _request_id(asked.stdout))
        job.finish()
    finally:
        job.kill()
    assert sorted(answers) == [1] and answers[1].state == WRITTEN


def _hostile_requests(folder) -> list[str]:
    """Request files that must be ignored: truncated, 10 MB, wrong types, a link, a FIFO, a
    request whose id is not its name's."""
    good = msgspec.json.encode(Request(id="0" * 16, written=time.time(), by="cli", steps=2, start=10**6))
    files = {
        "1" * 16: good[: len(good) // 2],
        "2" * 16: b'{"id": "' + b"2" * 16 + b'", "pad": "' + b"x" * (10 << 20) + b'"}',
        "3" * 16: msgspec.json.encode({"id": "3" * 16, "written": "now", "by": "cli", "steps": "ten", "start": []}),
        "4" * 16: good,  # its id is not its name's
    }
    for request_id, data in files.items():
        (folder / request_name(request_id)).write_bytes(data)
    outside = folder.parent.parent / "elsewhere.json"
    outside.write_bytes(good.replace(b"0" * 16, b"5" * 16))
    os.symlink(outside, folder / request_name("5" * 16))
    os.mkfifo(folder / request_name("6" * 16))
    return [request_name(c * 16) for c in "123456"]


def test_hostile_request_files_are_ignored_and_training_goes_on(tmp_path):
    job = Job(tmp_path, active=3)
    try:
        job.ready()
        names = _hostile_requests(job.run_dir / ".phaseprof" / "capture")
        asked = capture(str(job.logdir), "--run", "long", "--wait")
        assert asked.returncode == 0, asked.stderr + asked.stdout
        log = job.finish()
    finally:
        job.kill()
    for name in names:
        assert f"ignored the capture request {job.run_dir / '.phaseprof' / 'capture' / name}" in log, name
    assert "Traceback" not in log
    channel = read_channel(str(job.run_dir))
    assert len(channel.ignored) == len(names)
    assert [r.by for r in channel.requests] == ["cli"]


def _wait_for_the_slowdown_capture(job: Job, timeout: float = 600) -> None:
    """Until a request the slowdown trigger wrote has rank 0's final answer (or the job ended: the
    test then reads what it left)."""
    deadline = time.monotonic() + timeout
    while job.proc.poll() is None:
        channel = read_channel(str(job.run_dir))
        taken = [r.id for r in channel.requests if r.by == BY_SLOWDOWN]
        answers = [channel.answers.get(request_id, {}).get(0) for request_id in taken]
        if any(a is not None and a.state in FINAL for a in answers):
            return
        assert time.monotonic() < deadline, job.log()[-3000:]
        time.sleep(0.2)


#: A slowdown job: steps of 300 ms, the noise band then at least 15 ms (5% of the median), more than
#: a busy machine's delay in waking a process from its sleep (several ms at a load of 10-20 on 2
#: cores), held over the 8 steps the rule judges; from step 30 (the rule's 20 reference steps after
#: the configured window, steps 2-5) a sleep in forward doubles the step, four times the band's
#: ceiling (25% of the median). The rule has judged the 8 slow steps by step 38, and its 4-step
#: trace is written by step ~46; a slow job is stopped once it is
#: (`_wait_for_the_slowdown_capture`).
SLOWDOWN_JOB = dict(step_s=0.3, active=4, max_steps=60, slowdown=True, slow_s=0.3)
SLOW_FROM = 30


def test_slowdown_traces_the_steps_after_it_and_steady_runs_none(tmp_path):
    """One job slows down at step 30 (a sleep in forward); three steady jobs run beside it, 60 steps
    (as long as the slow one may run). Only the first takes a trace by itself, of steps after the
    slowdown."""
    slow_from = SLOW_FROM
    common = dict(SLOWDOWN_JOB, logdir=tmp_path / "profile")
    slow = Job(tmp_path, "slow", slow_from=slow_from, **common)
    steady = [Job(tmp_path, f"steady{k}", **common) for k in range(3)]
    try:
        _wait_for_the_slowdown_capture(slow)
        slow.finish()
        for job in steady:
            assert job.proc.wait(timeout=600) == 0, job.log()[-3000:]
    finally:
        for job in (slow, *steady):
            job.kill()
    channel = read_channel(str(slow.run_dir))
    (request,) = channel.requests
    assert request.by == "slowdown" and request.why is not None
    assert all(s >= slow_from for s in request.why.steps)
    assert min(request.why.step_ms) > request.why.median_ms + request.why.band_ms
    (answer,) = channel.answers[request.id].values()
    assert answer.state == WRITTEN and answer.first > slow_from and answer.last - answer.first + 1 == 4
    for job in steady:
        assert read_channel(str(job.run_dir)).requests == [], job.run_dir
    # the report reads the slowdown's trace
    report = analyze(str(slow.run_dir))
    (worker,) = report["runs"][0]["workers"]
    assert [s["step"] for s in worker["steps"]][-4:] == list(range(answer.first, answer.last + 1))


def test_a_request_for_steps_the_schedule_profiles_is_refused(tmp_path):
    """A hand-written request whose steps the configured window traces gets a reason, not a crash."""
    job = Job(tmp_path, active=3)
    try:
        job.ready()
        folder = capture_dir(str(job.run_dir))
        request = Request(id="a" * 16, written=time.time(), by="cli", steps=2, start=1)
        with open(os.path.join(folder, request_name(request.id)), "wb") as fh:
            fh.write(msgspec.json.encode(request))
        deadline = time.monotonic() + 300
        while request.id not in read_channel(str(job.run_dir)).answers:
            assert time.monotonic() < deadline, job.log()[-2000:]
            time.sleep(0.1)
        job.finish()
    finally:
        job.kill()
    answer = _answers(job.run_dir, request.id)[0]
    assert answer.state == REFUSED and "configured schedule" in answer.reason
    beat = msgspec.json.decode((job.run_dir / ".phaseprof" / "capture" / "rank0.json").read_bytes(), type=Heartbeat)
    assert beat.ended


def test_the_lightning_callback_answers_a_request(tmp_path):
    """The callback's profiler watches for requests like a plain loop's (and takes capture_on_slowdown)."""
    import lightning.pytorch as L  # the test extra installs it
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from phaseprof.capture_channel import FINAL, plan_request, write_request
    from phaseprof.lightning import PhaseProfilerCallback
    from phaseprof.training_hooks.capture import Slowdown

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):
            time.sleep(0.02)
            return self.net(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    run_dir = str(tmp_path / "lightning")

    class Ask(L.Callback):
        """Asks for 3 steps at batch 10; stops training once every rank answered."""

        request = None

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 10:
                self.request = plan_request(run_dir, 3)
                write_request(run_dir, self.request)
            if self.request is not None:
                answers = read_channel(run_dir).answers.get(self.request.id, {})
                if answers and all(a.state in FINAL for a in answers.values()):
                    trainer.should_stop = True

    callback = PhaseProfilerCallback(logdir=str(tmp_path), run="lightning", active=3, capture_on_slowdown=True)
    assert callback.profiler._slowdown == Slowdown()
    ask = Ask()
    trainer = L.Trainer(max_steps=3000, callbacks=[callback, ask], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(3000, 8)), batch_size=1))
    (answer,) = read_channel(run_dir).answers[ask.request.id].values()
    # (a single process that sees a request late starts at its next step: 10 steps of 20 ms are less
    # than one look of its watcher, so the request's start step may have passed)
    assert answer.state == WRITTEN and answer.last - answer.first == 2 and answer.first >= ask.request.start
    assert trainer.global_step < 3000  # stopped by the answer, not by running out of steps
    steps = _traced_steps(tmp_path, "lightning")
    (worker,) = steps
    assert steps[worker][-3:] == [answer.first, answer.first + 1, answer.first + 2]


def test_the_transformers_callback_answers_a_request(tmp_path):
    import torch
    import transformers  # the test extra installs it

    from phaseprof.capture_channel import FINAL, plan_request, write_request
    from phaseprof.transformers import PhaseProfilerCallback

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128,
                                                                 n_positions=32))
    tokens = torch.randint(0, 128, (16, 16))
    run_dir = str(tmp_path / "hf")

    class Ask(transformers.TrainerCallback):
        """Asks for 3 steps at step 10; stops training once every rank answered."""

        request = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 10:
                self.request = plan_request(run_dir, 3)
                write_request(run_dir, self.request)
            if self.request is not None:
                answers = read_channel(run_dir).answers.get(self.request.id, {})
                if answers and all(a.state in FINAL for a in answers.values()):
                    control.should_training_stop = True

    ask = Ask()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=1000, save_strategy="no",
        report_to=[], logging_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    data = [{"input_ids": t, "labels": t} for t in tokens]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[PhaseProfilerCallback(logdir=str(tmp_path), run="hf", active=3), ask])
    trainer.train()
    (answer,) = read_channel(run_dir).answers[ask.request.id].values()
    assert answer.state == WRITTEN and answer.last - answer.first == 2 and answer.first >= ask.request.start
    assert trainer.state.global_step < 1000  # stopped by the answer, not by running out of steps
    (steps,) = _traced_steps(tmp_path, "hf").values()
    assert steps[-3:] == [answer.first, answer.first + 1, answer.first + 2]


# -- a writer of the logdir against a running job ----------------------------------------------


def _listing(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_link_swapped_in_while_the_job_runs_is_never_followed(tmp_path):
    """The capture folder is replaced by a link to a folder outside the run, holding a decoy
    heartbeat and a request: the job writes nothing there, warns once, and trains on."""
    job = Job(tmp_path, active=3)
    outside = tmp_path / "outside"
    outside.mkdir()
    try:
        job.ready()
        beat = read_channel(str(job.run_dir)).beats[0]
        request = Request(id="d" * 16, written=time.time(), by="cli", steps=2,
                          start=beat.step + 200)
        (outside / "rank0.json").write_bytes(b"decoy")
        (outside / request_name(request.id)).write_bytes(msgspec.json.encode(request))
        before = _listing(outside)
        channel = job.run_dir / ".phaseprof" / "capture"
        channel.rename(job.run_dir / ".phaseprof" / "moved")
        channel.symlink_to(outside)
        deadline = time.monotonic() + 300
        # until the job said it stopped (or, as before, wrote through the link)
        while "capture channel is off" not in job.log() and _listing(outside) == before:
            assert time.monotonic() < deadline and job.proc.poll() is None, job.log()[-3000:]
            time.sleep(0.1)
        log = job.finish()
    finally:
        job.kill()
    assert _listing(outside) == before
    assert "moved" in os.listdir(job.run_dir / ".phaseprof")  # (the folder it wrote into before)
    assert ".phaseprof/capture is a link (never followed)" in log
    assert "Traceback" not in log and "the capture channel failed" not in log


def test_a_link_in_place_of_the_channel_before_start_is_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run_dir = tmp_path / "profile" / "long"
    run_dir.mkdir(parents=True)
    (run_dir / ".phaseprof").symlink_to(outside)
    job = Job(tmp_path, active=3)
    try:
        job.ready()
        log = job.finish()
    finally:
        job.kill()
    assert not (outside / "capture").exists()
    assert "cannot watch for capture requests" in log
    assert ".phaseprof is a link (never followed)" in log
    assert "Traceback" not in log


def _put(folder, name: str, fields: dict) -> None:
    """Write a file into the channel whole (a half-written request is ignored, as it should be)."""
    (folder / f".{name}.tmp").write_bytes(msgspec.json.encode(fields))
    os.replace(folder / f".{name}.tmp", folder / name)


def test_a_job_refuses_what_it_cannot_honour_and_reads_a_newer_format(tmp_path):
    """Requests another writer left (a start a million steps ahead, a time in the far future, a
    deadline before the start, a major format it does not know) are refused or ignored, so the
    next capture asked is taken; a request of a newer minor format, with a field this version does
    not know, is traced."""
    job = Job(tmp_path, active=3)
    folder = job.run_dir / ".phaseprof" / "capture"
    try:
        job.ready()
        step, now = read_channel(str(job.run_dir)).beats[0].step, time.time()
        hostile = {
            "a" * 16: dict(written=now, steps=1000, start=step + 10**6),  # refused: too far ahead
            "b" * 16: dict(written=1e308, steps=10, start=10**12),  # ignored: not a time
            # refused: expired
            "c" * 16: dict(written=now, steps=3, start=step + 900, expires=now + 1),
            "e" * 16: dict(written=now, steps=3, start=step + 900, format="2.0"),  # ignored: format
        }
        for request_id, fields in hostile.items():
            _put(folder, request_name(request_id), {"id": request_id, "by": "cli", **fields})
        far, expired = _final_answer(job, "a" * 16), _final_answer(job, "c" * 16)
        asked = capture(str(job.logdir), "--run", "long", "--steps", "2", "--wait")
        assert asked.returncode == 0, asked.stderr + asked.stdout
        newer = msgspec.to_builtins(plan_request(str(job.run_dir), 2))
        newer.update(format="1.7", priority="high")
        _put(folder, request_name(newer["id"]), newer)
        answer = _final_answer(job, newer["id"])
        log = job.finish()
    finally:
        job.kill()
    assert far.state == REFUSED and "too far ahead" in far.reason
    assert expired.state == REFUSED and "expired" in expired.reason
    assert answer.state == WRITTEN and answer.first >= newer["start"]
    assert f"{request_name('b' * 16)}: its time 1e+308 is not a time before now" in log
    assert f"{request_name('e' * 16)}: format 2.0: this phaseprof reads format 1.x" in log
    assert "Traceback" not in log


def test_a_forged_request_does_not_turn_the_slowdown_trigger_off(tmp_path):
    """A request at step 10**12, left before the run slows down, is refused at once: the slowdown
    is still traced by itself (before, the request stayed accepted, and the trigger waited on
    it)."""
    job = Job(tmp_path, "slow", slow_from=SLOW_FROM, **SLOWDOWN_JOB)
    folder = job.run_dir / ".phaseprof" / "capture"
    try:
        job.ready()  # step 20
        forged = {"id": "f" * 16, "by": "cli", "written": time.time(), "steps": 10, "start": 10**12}
        _put(folder, request_name(forged["id"]), forged)
        _wait_for_the_slowdown_capture(job)
        job.finish()
    finally:
        job.kill()
    channel = read_channel(str(job.run_dir))
    forged, taken = channel.requests
    assert forged.id == "f" * 16 and channel.answers[forged.id][0].state == REFUSED
    assert taken.by == "slowdown" and channel.answers[taken.id][0].state == WRITTEN


@pytest.mark.parametrize("where", ["s3", "az"])  # (gs: passes too, a minute more on a busy machine)
def test_a_store_going_away_mid_run_costs_one_warning_and_captures_resume_once_it_is_back(
        request, where, tmp_path):
    """The store stops while a job writes its run there: the loop goes on (the channel's looks are
    a thread's), one warning for the run, and once the store is back (empty: the bucket is made
    again) the job beats there again and takes a capture."""
    store, bucket = _new_bucket(request, where)
    job = Job(tmp_path, active=3, logdir=store.url(bucket, "profile"))
    try:
        job.ready()
        _wait_for_step(job, 0)  # its heartbeat is in the store
        store.stop()
        down = time.time()
        try:
            deadline = time.monotonic() + 300
            while "RuntimeWarning" not in job.log():
                assert time.monotonic() < deadline and job.proc.poll() is None, job.log()[-3000:]
                time.sleep(0.1)
        finally:
            store.start()  # back on the same port, empty
            store.create_bucket(bucket)
        back = time.time()
        deadline = time.monotonic() + 300  # the job beats in the store again (its next look)
        while not any(k.endswith("/.phaseprof/capture/rank0.json") for k in store.keys(bucket)):
            assert time.monotonic() < deadline and job.proc.poll() is None, job.log()[-3000:]
            time.sleep(0.2)
        asked = capture(str(job.logdir), "--run", "long", "--steps", "2", "--wait")
        assert asked.returncode == 0, asked.stderr + asked.stdout + job.log()[-3000:]
        (answer,) = _answers(job.run_dir, _request_id(asked.stdout)).values()
        log = job.finish()
    finally:
        job.kill()
    assert answer.state == WRITTEN and answer.last - answer.first == 1
    assert log.count("RuntimeWarning") == 1 and "Traceback" not in log
    # the channel's failures are at most one line of the summary, not one per look
    assert log.count("the capture channel in") <= 1 and "times)" not in log
    starts = job.starts()
    assert any(down < t < back for t in starts.values())  # steps went on while the store was away


def test_a_captures_gzip_runs_off_the_loop_and_close_waits_for_it(tmp_path, monkeypatch):
    """The loop goes on past a capture's last step while its trace is still being compressed (held
    here until the test lets it go), as it does for a scheduled window; close() waits for it, and
    the answer says written."""
    import threading

    import torch

    from phaseprof import PhaseProfiler
    from phaseprof.capture_channel import BY_CLI, TRACING
    from phaseprof.training_hooks.source_analysis import SourceAnalysis
    from tests.timing import train_step

    release, held = threading.Event(), []

    def compress_when_released(self, pending) -> None:
        held.append(pending.exported)
        release.wait(60)  # times out only if the loop waited for it: then the test fails
        self._compress_here(pending.exported)

    monkeypatch.setattr(SourceAnalysis, "_compress", compress_when_released)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(4, 8), torch.randint(0, 4, (4,))
    loss = torch.nn.functional.cross_entropy
    prof = PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=0, active=1, repeat=1,
                         analyze_traces=False)
    try:
        prof.attach(model, optimizer)
        for _ in range(3):
            train_step(model, optimizer, data, target, loss)
        request = Request(id="c0ffee00c0ffee00", written=time.time(), by=BY_CLI, steps=2,
                          start=prof.step_num + 2)
        with channel_folder(prof.run_dir) as folder:
            write_atomic(folder, request_name(request.id), msgspec.json.encode(request))
        prof._capture.tick()
        (plan,) = [p for p in prof._capture._plans if p.request.id == request.id]
        while prof.step_num <= plan.end:  # through the window, and one step beyond it
            train_step(model, optimizer, data, target, loss)
        # the loop is past the window, its trace exported but not compressed yet
        assert plan.files and plan.state == TRACING and not release.is_set()
        assert not any((tmp_path / "r" / name).exists() for name in plan.files), plan.files
    finally:
        release.set()
        prof.close()
    assert plan.state == WRITTEN and all((tmp_path / "r" / name).is_file() for name in plan.files)
    assert len(held) == 2  # the schedule's trace and the capture's, both compressed off the loop
    (answer,) = _answers(tmp_path / "r", request.id).values()
    assert answer.state == WRITTEN
