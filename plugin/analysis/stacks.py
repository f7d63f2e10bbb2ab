"""Python call stacks of ops, from the frames a ``with_stack=True`` trace records.

torch.profiler writes each Python frame as a complete event (category ``python_function``, named
``<file>(<line>): <function>``, or ``<built-in …>``) on the thread that ran it, so frames nest around
the ops they called like any other host events. An op's stack is the chain of frames covering its
start on its thread. Stacks repeat (a step calls the same lines many times), so they are kept as a
tree of call paths: node ``i`` is frame ``name[i]`` called from node ``parent[i]``; an op keeps one
node, its innermost frame's.

What a user wants to see first is their own line, not torch's: the *user frame* is the innermost
frame that is neither a built-in, a module record (``nn.Module: …``), the standard library nor a
framework package (`LIBRARIES`). Paths in the trace are relative to the ``sys.path`` entry they
were found under (``torch/nn/modules/module.py``), so the first part of a path names the package.
"""

from __future__ import annotations

import sys

import msgspec
import numpy as np

from ..reading.events import HostEvents
from .nesting import Nesting, nest

#: Packages whose frames are not the user's code: PyTorch, its frameworks, this profiler.
LIBRARIES = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "functorch", "triton", "numpy", "phaseprof",
    "training_hooks", "lightning", "pytorch_lightning", "lightning_fabric", "transformers", "accelerate",
    "deepspeed", "apex", "typing_extensions", "tqdm",
})
#: The most frames a stack shows (the innermost ones).
MAX_FRAMES = 64
#: How torch.profiler names a module's call (``with_modules=True``).
MODULE_RECORD = "nn.Module: "


class CallPaths(msgspec.Struct):
    """Call paths as a tree: node i is frame ``name[i]`` (into ``SpanAnalysis.names``) called from node
    ``parent[i]`` (-1: the outermost frame of its thread)."""

    parent: np.ndarray  # int32
    name: np.ndarray  # int32


def no_call_paths() -> CallPaths:
    return CallPaths(parent=np.zeros(0, np.int32), name=np.zeros(0, np.int32))


def call_paths(python: HostEvents) -> tuple[CallPaths, Nesting, np.ndarray]:
    """The call-path tree of ``python``'s frames, their nesting, and each frame's node (in the
    nesting's order). Built depth by depth: a node is a (parent node, name) pair, interned."""
    n = nest(python)
    node = np.full(len(n.ts), -1, np.int64)
    parents, names = [], []
    count = 0
    width = max(int(n.name.max()) + 1, 1) if len(n.name) else 1
    by_depth = np.argsort(n.depth, kind="stable")  # one sort, then a slice per depth (was a scan)
    levels = (np.split(by_depth, np.flatnonzero(np.diff(n.depth[by_depth])) + 1) if len(by_depth)
              else [])
    for at in levels:
        up = np.where(n.parent[at] >= 0, node[np.maximum(n.parent[at], 0)], -1)
        keys, inverse = np.unique((up + 1) * width + n.name[at], return_inverse=True)
        node[at] = count + inverse.ravel()
        parents.append(keys // width - 1)
        names.append(keys % width)
        count += len(keys)
    paths = CallPaths(parent=np.concatenate(parents).astype(np.int32) if parents else np.zeros(0, np.int32),
                      name=np.concatenate(names).astype(np.int32) if names else np.zeros(0, np.int32))
    return paths, n, node


def enclosing(outer: Nesting, thread: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """For each instant ``ts`` on ``thread``: the innermost event of ``outer`` covering it (index into
    ``outer``'s order; an event starting at that very instant covers it), -1 where none does.

    From the last event starting at or before the instant, up its ancestors to the first one not
    ended by it. The climb jumps by powers of two (each event's 2^k-th ancestor, and the latest end
    among the 2^k events from it up): records nested 10,000 deep climbed one level per pass."""
    found = np.full(len(ts), -1, np.int64)
    if not len(outer.ts) or not len(ts):
        return found
    up, reach = [outer.parent], [outer.end]  # 2^k-th ancestor; latest end of the 2^k events from it
    while (up[-1] >= 0).any():  # as many levels as the nesting's depth has bits
        last, safe = up[-1], np.maximum(up[-1], 0)
        up.append(np.where(last >= 0, last[safe], -1))
        reach.append(np.where(last >= 0, np.maximum(reach[-1], reach[-1][safe]), reach[-1]))
    bounds = np.flatnonzero(np.r_[True, outer.thread[1:] != outer.thread[:-1], True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        mine = np.flatnonzero(thread == outer.thread[lo])
        if not len(mine):
            continue
        t = ts[mine]
        at = lo + np.searchsorted(outer.ts[lo:hi], t, side="right") - 1
        at[at < lo] = -1
        # an ancestor starts no later than its child: all 2^k have ended when the latest end has
        # and the first started before the instant
        for k in range(len(up) - 1, -1, -1):
            safe = np.maximum(at, 0)
            ended = (at >= 0) & (reach[k][safe] <= t) & (outer.ts[safe] < t)
            at[ended] = up[k][at[ended]]
        found[mine] = at
    return found


def op_paths(python: HostEvents, n: Nesting) -> tuple[CallPaths, np.ndarray]:
    """The call-path tree and, for each host event of ``n`` (in its order), its stack's node (-1:
    no frame covers it, e.g. a trace recorded without ``with_stack``)."""
    if not len(python.ts):
        return no_call_paths(), np.full(len(n.ts), -1, np.int64)
    paths, pn, node = call_paths(python)
    inner = enclosing(pn, n.thread, n.ts)
    return paths, np.where(inner >= 0, node[np.maximum(inner, 0)], -1)


def is_user_frame(name: str) -> bool:
    """Whether a frame is the user's code (see the module's docstring)."""
    if not name or name.startswith("<") or name.startswith(MODULE_RECORD):
        return False
    path = name.split("(", 1)[0]
    if "site-packages/" in path or "dist-packages/" in path or path.startswith("/usr/lib/python"):
        return False
    top = path.split("/", 1)[0]
    top = top[:-3] if top.endswith(".py") else top
    return top not in LIBRARIES and top not in sys.stdlib_module_names


def stack(paths: CallPaths, names: list[str], node: int) -> list[str]:
    """The frames of call path ``node``, innermost first (at most `MAX_FRAMES`)."""
    out = []
    while 0 <= node < len(paths.parent) and len(out) < MAX_FRAMES:
        out.append(names[int(paths.name[node])])
        node = int(paths.parent[node])
    return out


def user_frame(frames: list[str]) -> str | None:
    """The innermost user frame of a stack (innermost first), else None."""
    return next((f for f in frames if is_user_frame(f)), None)
