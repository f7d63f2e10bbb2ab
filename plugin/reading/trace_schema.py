"""The trace schemas met in the wild, as one table: which event categories mean what.

Kineto has written its categories differently over the years and per device vendor; the reader
looks categories up here and nowhere else. Add a variant here when a new one turns up.
"""

from __future__ import annotations

from typing import NamedTuple

from .events import ANNOTATION, KERNEL, MEMCPY, MEMSET, OP, PYTHON, RUNTIME


class Variant(NamedTuple):
    name: str
    host: dict[str, int]  # category -> host event kind
    device: dict[str, int]  # category -> device event kind
    note: str


VARIANTS = (
    Variant("today", {"cpu_op": OP, "user_annotation": ANNOTATION, "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME,
                      "python_function": PYTHON},
            {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET},
            "torch >= 1.10 (CUDA): flows `ac2g`/`fwdbwd`, `External id`, `[memory]` instant events; "
            "`python_function` frames with `with_stack`, `nn.Module: …` with `with_modules`"),
    Variant("2021", {"Operator": OP, "Runtime": RUNTIME}, {"Kernel": KERNEL, "Memcpy": MEMCPY, "Memset": MEMSET},
            "torch 1.8-1.9: capitalised categories, `tid` may be a string (`\"stream 7\"`), `external id`"),
    Variant("legacy export", {"": OP}, {},
            "`torch.autograd.profiler.profile.export_chrome_trace`: no category, no step markers"),
    Variant("ROCm", {}, {},
            "AMD (roctracer): today's categories with `hip*` runtime calls (`hipLaunchKernel`, "
            "`hipExtModuleLaunchKernel`, `hipMemcpyWithStream`) and string-typed args (`\"stream\": \"0x0\"`, "
            "`\"size\": \"2560\"`, `\"kind\": \"1\"`); the default stream is 0"),
    Variant("MTIA", {"mtia_runtime": RUNTIME}, {"mtia_ccp_events": KERNEL}, "Meta's accelerator"),
    Variant("XPU", {"xpu_runtime": RUNTIME, "xpu_driver": RUNTIME}, {}, "Intel GPUs: device events as `kernel`"),
    Variant("PrivateUse1", {"privateuse1_runtime": RUNTIME, "privateuse1_driver": RUNTIME}, {},
            "out-of-tree device backends: device events as `kernel`"),
)

#: Host event kind by category, over all variants.
HOST_KINDS: dict[str, int] = {cat: kind for v in VARIANTS for cat, kind in v.host.items()}
#: Device event kind by category, over all variants.
DEVICE_KINDS: dict[str, int] = {cat: kind for v in VARIANTS for cat, kind in v.device.items()}

#: Event phases of the Chrome trace format; anything else is malformed. An event without a
#: phase is ignored without complaint (there is nothing in it to read).
KNOWN_PHASES = frozenset("BEXiIMCbensftPONDcRSTpF") | {""}
#: The phases the reader uses: complete events, instants (`[memory]`) and metadata (thread names).
READ_PHASES = frozenset("XiIM")
#: The name of allocation / free instant events.
MEMORY_EVENT = "[memory]"
#: Categories that may hold `[memory]` events (today's, the legacy export's, and none in 2021).
INSTANT_CATEGORIES = frozenset({"cpu_instant_event", ""})
