"""`phaseprof report` as a user runs it: a subprocess, its output and exit status."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.logdir import write_trace
from tests.tracebuilder import op, step


def report(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", *args], capture_output=True, text=True,
                          cwd=cwd, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin", "PHASEPROF_CACHE": "off"})


def test_gpu_trace_shows_forward_backward_optimizer_cpu_and_gpu_per_step(traces):
    out = report(str(traces.folder("gpu", "hta_ns_resolution")))
    assert out.returncode == 0, out.stderr
    data = json.loads(report(str(traces.folder("gpu", "hta_ns_resolution")), "--json").stdout)
    rows = data["runs"][0]["workers"][0]["steps"]
    assert [r["step"] for r in rows] == [101, 102, 103, 104, 105]
    for r in rows:
        for phase in ("forward", "backward", "optimizer"):
            assert r["phases"][phase]["host_ms"] > 0
            assert r["phases"][phase]["gpu_ms"] > 0
        # backward kernels are launched from the autograd thread, yet attributed to backward
        assert r["phases"]["backward"]["gpu_ms"] > r["phases"]["forward"]["gpu_ms"]
        # the terminal table shows the same figures (host/GPU with one decimal)
        cell = f"{r['phases']['backward']['host_ms']:.1f}/{r['phases']['backward']['gpu_ms']:.1f}"
        line = next(line for line in out.stdout.splitlines() if line.strip().startswith(str(r["step"])))
        assert cell in line


def test_json_contract(traces):
    out = report(str(traces.root / "cpu"), "--json")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert set(data) >= {"runs", "errors"}
    assert data["errors"] == []
    runs = {r["run"]: r for r in data["runs"]}
    assert "base" in runs and "legacy" in runs
    worker = runs["repeat2"]["workers"][0]
    assert set(worker) >= {"worker", "spans", "steps"}
    assert len(worker["spans"]) == 2
    row = worker["steps"][0]
    assert set(row) >= {"step", "wall_ms", "inferred", "phases"}
    assert set(row["phases"]) >= {"data", "forward", "backward", "optimizer", "other"}
    assert set(row["phases"]["forward"]) >= {"host_ms", "gpu_ms"}
    assert [r["step"] for r in worker["steps"]] == [2, 3, 4, 7, 8, 9]


def test_run_and_step_options(traces):
    out = report(str(traces.root / "cpu"), "--run", "base", "--step", "5", "--json")
    data = json.loads(out.stdout)
    assert [r["run"] for r in data["runs"]] == ["base"]
    worker = data["runs"][0]["workers"][0]
    assert [r["step"] for r in worker["steps"]] == [5]
    detail = worker["detail"]
    assert detail["ops"]["forward"] and detail["memory"]["forward"]["cpu"]["peak_bytes"] > 0
    text = report(str(traces.root / "cpu"), "--run", "base", "--step", "5").stdout
    assert "step 5 · forward" in text and detail["ops"]["forward"][0]["name"] in text


def test_terminal_report_names_the_slowest_step_top_ops_and_findings(traces):
    text = report(str(traces.folder("cpu", "noannot"))).stdout
    assert "slowest: step" in text
    assert "top ops of backward" in text
    assert "inferred from the ops" in text  # the finding that says phases were inferred


def test_terminal_findings_show_their_saving_and_on_demand_their_evidence(traces):
    folder = str(traces.folder("gpu", "kineto_resnet50_num_workers_0"))
    first = json.loads(report(folder, "--json").stdout)["runs"][0]["workers"][0]["summary"]["findings"][0]
    text = " ".join(report(folder).stdout.split())
    assert f"• [≤ {first['saving_ms']:,.2f} ms] {first['text'][:60]}" in text
    assert "loader: single-process" not in text
    text = " ".join(report(folder, "--evidence").stdout.split())
    assert "measure: host" in text and "loader: single-process" in text


def test_exit_status_is_nonzero_only_when_nothing_was_readable(tmp_path):
    (tmp_path / "bad.1.pt.trace.json").write_text("{")
    out = report(str(tmp_path))
    assert out.returncode == 1
    assert "bad.1.pt.trace.json: not valid JSON" in out.stdout
    write_trace(tmp_path / "good.1.pt.trace.json", [step(1, 0, 100), op("aten::mm", 10, 50)])
    out = report(str(tmp_path), "--json")
    assert out.returncode == 0
    assert [e["path"].rsplit("/", 1)[-1] for e in json.loads(out.stdout)["errors"]] == ["bad.1.pt.trace.json"]


def test_missing_path_and_unknown_run(tmp_path):
    out = report(str(tmp_path / "nope"))
    assert out.returncode == 1 and "no such file or directory" in out.stdout
    write_trace(tmp_path / "good.1.pt.trace.json", [step(1, 0, 100), op("aten::mm", 10, 50)])
    out = report(str(tmp_path), "--run", "other", "--json")
    assert out.returncode == 1
    assert "no run named 'other'" in json.loads(out.stdout)["errors"][0]["error"]


def test_python_api_returns_what_json_prints(traces):
    from phaseprof import analyze

    path = str(traces.folder("cpu", "base"))
    assert json.loads(report(path, "--json").stdout) == json.loads(json.dumps(analyze(path)))


def _big_trace(path, steps=150, ops=200):
    """A trace of several MB: steps of many small ops."""
    events = []
    for s in range(steps):
        t0 = s * 10_000
        events.append(step(s, t0, 10_000))
        events += [op("aten::add", t0 + 10 + 40 * k, 30, **{"Input Dims": [[64, 64], [64, 64]]}) for k in range(ops)]
    return write_trace(path, events)


def test_progress_bar_only_when_stderr_is_a_terminal(tmp_path):
    import os
    import pty

    trace = _big_trace(tmp_path / "big.1.pt.trace.json")
    assert trace.stat().st_size > 4 << 20
    plain = report(str(trace), "--json")
    assert plain.returncode == 0 and plain.stderr == ""  # stderr is a pipe here: no bar
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "phaseprof.cli", "report", "--json", str(trace)],
                            stdout=subprocess.PIPE, stderr=follower,
                            env={"PATH": "/usr/bin:/bin", "TERM": "xterm", "PHASEPROF_CACHE": "off"})
    os.close(follower)
    out, _ = proc.communicate(timeout=300)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    assert proc.returncode == 0
    assert json.loads(out)["runs"]  # stdout stays clean JSON
    assert b"reading big.1.pt.trace.json" in drawn


def test_the_slowest_step_line_names_fast_outliers_beside_a_slowest_step_within_noise(traces):
    # HTA's V100 run: the slowest step is within noise, steps 101 and 102 are fast outliers
    text = " ".join(report(str(traces.folder("gpu", "hta_ns_resolution"))).stdout.split())
    assert "slowest: step 105 (95.70 ms), within the steps' noise" in text
    assert "steps 101, 102 faster, beyond it" in text
    text = " ".join(report(str(traces.folder("gpu", "hta_sampled_2rank"))).stdout.split())
    assert "too few steps to tell from noise (at least 5)" in text
