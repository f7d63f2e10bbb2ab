"""Hand-built Kineto events for tests that need one precise situation (today's schema)."""

from __future__ import annotations

PID = 100
MAIN = 100
AUTOGRAD = 101


def op(name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "cpu_op", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}


def annotation(name: str, ts: float, dur: float, tid: int = MAIN) -> dict:
    return op(name, ts, dur, tid, cat="user_annotation")


def step(number: int, ts: float, dur: float) -> dict:
    return annotation(f"ProfilerStep#{number}", ts, dur)


def launch(ts: float, corr: int, tid: int = MAIN, dur: float = 1.0, name: str = "cudaLaunchKernel") -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "device": 0, "stream": stream}}


def memory(ts: float, nbytes: int, total: int, device_type: int = 1, device_id: int = 0) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID, "tid": MAIN, "ts": ts,
            "args": {"Bytes": nbytes, "Total Allocated": total, "Device Type": device_type, "Device Id": device_id}}


def thread_names() -> list[dict]:
    return [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "args": {"name": "thread 100 (python)"}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": AUTOGRAD, "args": {"name": "thread 101 (pt_autograd_0)"}},
    ]
