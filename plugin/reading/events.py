"""The compact event model one trace file decodes into: columns of numbers, names as codes.

A 150 MB trace holds ~400k events; as Python objects they would cost several times the file size and
every analysis would loop over them in Python. Columns (numpy arrays) keep memory near the raw
numbers and let the analysis work on whole arrays at once. Strings appear once, in a table.
"""

from __future__ import annotations

import msgspec
import numpy as np

# Host event kinds (HostEvents.kind).
OP = 0  #: an operator (`cpu_op`, 2021 `Operator`, or a legacy event without category)
ANNOTATION = 1  #: a `record_function` / user range (`user_annotation`)
RUNTIME = 2  #: a CUDA/HIP runtime or driver call (`cuda_runtime`, `cuda_driver`, 2021 `Runtime`)
#: a Python frame (`python_function`, ``with_stack=True``), or a module's call (``nn.Module: <Class>_<n>``,
#: ``with_modules=True``); kept apart from the others in ``Trace.python``
PYTHON = 3

# Device event kinds (DeviceEvents.kind).
KERNEL = 0
MEMCPY = 1
MEMSET = 2

#: Memory device types as `[memory]` events write them (c10::DeviceType).
MEMORY_DEVICE_TYPES = {0: "cpu", 1: "cuda", 8: "ipu", 9: "xpu", 12: "mps", 13: "meta", 20: "privateuse1"}


def memory_device_label(device_type: int, device_id: int) -> str:
    """`cpu`, `cuda:0`, … for a memory event's device."""
    kind = MEMORY_DEVICE_TYPES.get(device_type, f"device{device_type}")
    return kind if device_id < 0 or kind == "cpu" else f"{kind}:{device_id}"


class HostEvents(msgspec.Struct):
    """Complete (`X`) host events: operators, annotations and runtime calls.

    ``thread`` indexes ``Trace.threads``; ``name`` indexes ``Trace.names``; ``shapes`` indexes
    ``Trace.shapes`` (0 = none recorded); ``corr`` is -1 except on runtime calls; ``seq`` is an op's
    autograd sequence number (-1: none), shared by a forward op and the backward op of its gradient.
    """

    ts: np.ndarray  # float64 µs
    dur: np.ndarray  # float64 µs
    thread: np.ndarray  # int32
    name: np.ndarray  # int32
    kind: np.ndarray  # int8
    corr: np.ndarray  # int64 correlation (runtime calls)
    shapes: np.ndarray  # int32
    comm: np.ndarray  # int32 index into Trace.comms (0 = not a recorded collective)
    seq: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, rows: np.ndarray) -> HostEvents:
        """These events at ``rows`` (a mask or indices)."""
        return HostEvents(**{f: getattr(self, f)[rows] for f in self.__struct_fields__})


class CommArgs(msgspec.Struct, frozen=True):
    """A collective as ``record_param_comms`` records it in its args ("" / -1: not recorded)."""

    kind: str = ""  # "Collective name": allreduce, _allgather_base, all_to_all, …
    dtype: str = ""  # the element type ("Float", "BFloat16", …)
    in_nelems: int = -1  # "In msg nelems"
    out_nelems: int = -1  # "Out msg nelems"
    group_size: int = -1  # "Group size"
    group: str = ""  # "Process Group Name", else "Process Group ID"
    seq: int = -1  # "Seq": the collective's sequence number in its process group


class DeviceEvents(msgspec.Struct):
    """GPU activity: kernels, memcpys, memsets. ``corr`` links each to the runtime call that launched it."""

    ts: np.ndarray  # float64 µs
    dur: np.ndarray  # float64 µs
    device: np.ndarray  # int32
    stream: np.ndarray  # int64 (ROCm stream ids are 64-bit handles)
    name: np.ndarray  # int32
    kind: np.ndarray  # int8
    corr: np.ndarray  # int64
    # A kernel's launch as Kineto records it (NaN / -1 where not recorded: copies, sets, older traces).
    blocks_per_sm: np.ndarray  # float64 "blocks per SM"
    occupancy: np.ndarray  # float64 "est. achieved occupancy %"
    registers: np.ndarray  # int64 "registers per thread"
    shared_memory: np.ndarray  # int64 "shared memory" (bytes per block)
    grid: np.ndarray  # int64 `pack_dims` of "grid"
    block: np.ndarray  # int64 `pack_dims` of "block"

    def __len__(self) -> int:
        return len(self.ts)


#: CUDA's limits on a launch's dimensions: x below 2**31, y and z below 2**16, so [x, y, z] packs
#: into one int64 (-1: not recorded).
_DIM_BITS = 16


def pack_dims(x: int, y: int, z: int) -> int:
    """``[x, y, z]`` of a grid or block as one integer (``unpack_dims`` reverses it)."""
    return (x << 2 * _DIM_BITS) | (y << _DIM_BITS) | z


def unpack_dims(packed: int) -> list[int] | None:
    """``[x, y, z]`` from `pack_dims`, None for -1 (not recorded)."""
    if packed < 0:
        return None
    mask = (1 << _DIM_BITS) - 1
    return [packed >> 2 * _DIM_BITS, (packed >> _DIM_BITS) & mask, packed & mask]


def fits_dims(dims: object) -> bool:
    """Whether ``dims`` is a grid or block `pack_dims` can hold: three integers within CUDA's limits."""
    return (isinstance(dims, list | tuple) and len(dims) == 3 and all(type(d) is int for d in dims)
            and 0 <= dims[0] < 1 << 31 and 0 <= dims[1] < 1 << _DIM_BITS and 0 <= dims[2] < 1 << _DIM_BITS)


class MemoryEvents(msgspec.Struct):
    """`[memory]` instant events: each allocation (+bytes) or free (-bytes) and the total after it."""

    ts: np.ndarray  # float64 µs
    nbytes: np.ndarray  # int64
    total: np.ndarray  # int64; -1 when the trace does not record "Total Allocated"
    reserved: np.ndarray  # int64; -1 when the trace does not record "Total Reserved"
    device: np.ndarray  # int32, indexes Trace.memory_devices
    addr: np.ndarray  # int64 "Addr" of the block (-1: not recorded)
    thread: np.ndarray  # int32 index into Trace.threads: the thread that allocated or freed

    def __len__(self) -> int:
        return len(self.ts)


class Thread(msgspec.Struct):
    """One host thread: its process and label (from `thread_name` metadata when present)."""

    pid: int | str
    tid: int | str
    label: str


class Trace(msgspec.Struct):
    """One decoded trace file (a span): events as columns plus what the file says about itself."""

    path: str
    host: HostEvents
    device: DeviceEvents
    memory: MemoryEvents
    names: list[str]
    shapes: list[str]  # JSON text of "Input Dims", "" at index 0
    threads: list[Thread]
    memory_devices: list[str]
    #: Python frames and module calls (kind PYTHON), written with ``with_stack`` / ``with_modules``
    python: HostEvents
    #: the collectives' recorded args, `HostEvents.comm` indexes them (index 0: none)
    comms: list[CommArgs] = msgspec.field(default_factory=lambda: [CommArgs()])
    rank: int | None = None
    world_size: int | None = None
    gpu_names: list[str] = msgspec.field(default_factory=list)
    gpu_capabilities: list[str] = msgspec.field(default_factory=list)  # "major.minor" per GPU, "" unknown
    cpus: int | None = None  # CPUs the training process could use, where the trace records them
    #: Events skipped (or read without a field) as malformed, and one line saying how many, why, and which first.
    skipped: int = 0
    first_problem: str = ""
