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
    """A kernel, or a copy or set when ``name`` says so (``Memcpy HtoD (Pageable -> Device)``)."""
    cat = "gpu_memcpy" if name.startswith("Memcpy") else "gpu_memset" if name.startswith("Memset") else "kernel"
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "device": 0, "stream": stream}}


def memory(ts: float, nbytes: int, total: int, device_type: int = 1, device_id: int = 0) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID, "tid": MAIN, "ts": ts,
            "args": {"Bytes": nbytes, "Total Allocated": total, "Device Type": device_type, "Device Id": device_id}}


def thread_names() -> list[dict]:
    return [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "args": {"name": "thread 100 (python)"}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": AUTOGRAD, "args": {"name": "thread 101 (pt_autograd_0)"}},
    ]


class Loop:
    """A hand-built training loop, step by step: each phase is a range on the loop's thread holding
    the host ops given, and launching kernels evenly over its host time (5 µs launches on stream 7,
    each kernel starting once the launch is done and the GPU free: the GPU runs behind the host)."""

    def __init__(self) -> None:
        self.events: list[dict] = thread_names()
        self.t = 0.0
        self.corr = 0
        self.gpu_free = 0.0

    def step(self, number: int, *phases: tuple) -> Loop:
        """``phases``: ``(range name, host µs, kernels, ops)``; ``kernels`` a list of (name, µs, stream,
        launching call, its µs) or a prefix of it (``cudaLaunchKernel`` of 5 µs on stream 7); ``ops`` a list of
        (name, offset µs, µs[, category]) inside the range. Host µs
        ``"sync"``: the range waits in cudaStreamSynchronize until the GPU has drained."""
        start = self.t
        for name, host_us, *rest in phases:
            kernels = rest[0] if rest else []
            ops = list(rest[1]) if len(rest) > 1 else []
            if host_us == "sync":
                wait = max(self.gpu_free - self.t, 0.0) + 10.0
                host_us = wait + 20.0
                ops.append(("cudaStreamSynchronize", 5.0, wait, "cuda_runtime"))
            self.events.append(annotation(name, self.t, host_us))
            for k, spec in enumerate(kernels):
                at = self.t + host_us * k / max(len(kernels), 1)
                self.corr += 1
                call = spec[3] if len(spec) > 3 else "cudaLaunchKernel"
                self.events.append(launch(at, self.corr, dur=spec[4] if len(spec) > 4 else 5.0, name=call))
                begin = max(at + 5.0, self.gpu_free)
                self.events.append(kernel(spec[0], begin, spec[1], self.corr, stream=spec[2] if len(spec) > 2 else 7))
                self.gpu_free = begin + spec[1]
            for spec in ops:
                op_name, offset, dur = spec[:3]
                self.events.append(op(op_name, self.t + offset, dur, cat=spec[3] if len(spec) > 3 else "cpu_op"))
            self.t += host_us
        self.events.append(step(number, start, self.t - start))
        return self


def collective(kind: str, ts: float, corr: int, kernel_ts: float, kernel_us: float, *, tid: int = MAIN,
               host_us: float = 20.0, stream: int = 20, kernel_name: str | None = None, **args) -> list[dict]:
    """A c10d collective as PyTorch records it: ``record_param_comms`` (its ``args``: "Collective name",
    "dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group Name", "Seq", … given as
    keywords with spaces written as underscores) around ``nccl:<kind>``, whose launch runs the NCCL
    kernel at ``kernel_ts`` on ``stream``."""
    recorded = {k.replace("_", " ") if k not in ("dtype",) else k: v for k, v in args.items()}
    name = kernel_name or f"ncclDevKernel_{kind.title().replace('_', '')}_RING_LL(ncclDevComm*, ncclWork*)"
    return [op("record_param_comms", ts, host_us, tid, **recorded),
            op(f"nccl:{kind}", ts + 1.0, host_us - 2.0, tid),
            launch(ts + 2.0, corr, tid),
            kernel(name, kernel_ts, kernel_us, corr, stream=stream)]
