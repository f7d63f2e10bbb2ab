"""The answers' one definition (plugin/answers.py) and what follows from it: the tab's generated
TypeScript types, the examples of plugin/http_api.md, and the phase registry every view reads."""

from __future__ import annotations

import re
import subprocess
import sys

import msgspec
import pytest

from phaseprof.contract import (
    FRAMEWORK_PHASES,
    PHASE_REGISTRY,
    PHASES,
    USER_PHASE_COLOURS,
    phase_colour,
)
from phaseprof.plugin import answers
from phaseprof.plugin.analysis.names import range_phase
from phaseprof.plugin.typescript import typescript
from tests.conftest import ROOT
from tests.logdir import write_trace
from tests.tracebuilder import annotation, op, step

HTTP_API = ROOT / "plugin" / "http_api.md"
#: The answer of each route section of http_api.md.
ROUTE_ANSWERS = {
    "/runs": answers.RunsAnswer,
    "/steps": answers.StepsAnswer,
    "/step": answers.StepDetail,
    "/timeline": answers.TimelineAnswer,
    "/compare": answers.CompareAnswer,
    "/ranks": answers.RanksAnswer,
    "/trace": answers.StepTrace,
    "/kernels": answers.KernelsAnswer,
    "/ops": answers.OpsAnswer,
    "/memory": answers.MemoryAnswer,
    "/capture": answers.CaptureAnswer,
    "/collectives": answers.CollectivesAnswer,
    "/memory_events": answers.MemoryEventsAnswer,
    "/modules": answers.ModulesAnswer,
}


def test_committed_typescript_types_are_generated_from_the_answers():
    committed = (ROOT / "frontend" / "src" / "answers.ts").read_text(encoding="utf-8")
    assert committed == typescript(), (
        "frontend/src/answers.ts is not what plugin/answers.py generates: run "
        "`python -m phaseprof.plugin.typescript`, then rebuild the bundle (cd frontend && npm ci && npm run build)")


def test_generated_types_carry_every_field_and_mark_omitted_ones_optional():
    ts = typescript()
    changed_op = re.search(r"export interface ChangedOp \{(.*?)\}", ts, re.S).group(1)
    for field in answers.ChangedOp.__struct_fields__:
        assert f"  {field}: number;" in changed_op or f"  {field}: string;" in changed_op
    assert "a_self_gpu_ms: number;" in changed_op
    summary = re.search(r"export interface Summary \{(.*?)\}", ts, re.S).group(1)
    assert "  findings: Finding[];" in summary  # always there
    assert "  mean?: Record<string, PhaseMean>;" in summary  # left out when no step holds work
    assert "  verdict: 'balanced' | 'cpu-bound' | 'gpu-bound' | null;" in ts
    # a subclass's interface extends its base's, declaring only its own fields (each once)
    detail = re.search(r"export interface StepDetail extends StepRow \{(.*?)\}", ts, re.S).group(1)
    assert [line.split(":")[0].strip() for line in detail.strip().splitlines()] == [
        f for f in answers.StepDetail.__struct_fields__ if f not in answers.StepRow.__struct_fields__]


def _examples() -> list[tuple[str, str]]:
    """(route, JSON text) of every ```json block of http_api.md, by the ``## `GET /route…` `` above it."""
    route, found = None, []
    for block in re.split(r"^(## .*)$", HTTP_API.read_text(encoding="utf-8"), flags=re.M):
        heading = re.match(r"## `GET (/\w+)", block)
        if heading:
            route = heading.group(1)
            continue
        found += [(route, text) for text in re.findall(r"```json\n(.*?)```", block, re.S)]
    return found


def test_http_api_has_an_example_of_every_answer():
    assert sorted({route for route, _ in _examples()}) == sorted(ROUTE_ANSWERS)


@pytest.mark.parametrize(("route", "text"), _examples(), ids=lambda v: v if v in ROUTE_ANSWERS else "")
def test_http_api_examples_are_answers(route, text):
    # strict: no ints for strings or the like, no field the answer lacks, every field it requires
    answer = msgspec.json.decode(text, type=ROUTE_ANSWERS[route], strict=True)
    assert msgspec.json.decode(msgspec.json.encode(answer)) == msgspec.json.decode(text)


def test_answers_refuse_fields_they_do_not_define():
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.json.decode(b'{"path": "a", "error": "b", "line": 3}', type=answers.FileError)


def test_phase_registry_names_canonical_phases_in_order_with_colours_and_aliases():
    assert PHASES == ("data", "forward", "backward", "optimizer", "other")
    assert [phase_colour(p) for p in PHASES] == [p.colour for p in PHASE_REGISTRY]
    assert len({p.colour for p in PHASE_REGISTRY}) == len(PHASE_REGISTRY)
    # The frameworks' phases: named like a user's (not canonical: listed only where they ran), each
    # with a colour of its own, apart from the canonical ones and the user phases' palette.
    assert [p.name for p in FRAMEWORK_PHASES] == ["lightning", "transformers"]
    assert [phase_colour(p.name) for p in FRAMEWORK_PHASES] == [p.colour for p in FRAMEWORK_PHASES]
    colours = [p.colour for p in PHASE_REGISTRY + FRAMEWORK_PHASES] + list(USER_PHASE_COLOURS)
    assert len(set(colours)) == len(colours)
    assert phase_colour("loss") == "#8d6e63" and phase_colour("mine") == "#ffca28"  # a user's phase keeps its colour
    aliases = {
        "## forward ##": "forward", "##Backward##": "backward", "## zero_grad ##": "optimizer",
        "## data_load ##": "data", "Forward": "forward", "OPTIMIZER": "optimizer",
        "[pl][profile][LightningModule]Model.training_step": "forward",
        "[pl][profile][Strategy]SingleDeviceStrategy.backward": "backward",
        "[pl][profile][LightningModule]Model.optimizer_step": "optimizer",
        "[pl][profile][_TrainingEpochLoop].train_dataloader_next": "data",
        "Optimizer.step#SGD.step": "optimizer", "Optimizer.zero_grad#Adam.zero_grad": "optimizer",
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__": "data",
        "DistributedDataParallel.forward": "forward", "phaseprof::loss": "loss",
        "[pl][profile]forward": None, "aten::forward": None, "forward\n": None, "ProfilerStep#3": None,
    }
    assert {name: range_phase(name) for name in aliases} == aliases


def test_a_phase_added_to_the_registry_is_analysed_in_its_place(tmp_path):
    # One entry in the registry: the analysis finds its ranges and orders it with the canonical phases.
    trace = write_trace(tmp_path / "w.1.pt.trace.json", [
        step(1, 0, 1_000), annotation("## forward ##", 0, 400), annotation("## loss ##", 400, 100),
        annotation("## backward ##", 500, 400), op("aten::mm", 10, 50),
    ])
    code = f"""
import json, phaseprof.contract as c
loss = c.Phase("loss", "#ff0000", (r"(?i:##\\s*loss\\s*##)",))
c.PHASE_REGISTRY = c.PHASE_REGISTRY[:3] + (loss,) + c.PHASE_REGISTRY[3:]
c.PHASES = tuple(p.name for p in c.PHASE_REGISTRY)
from phaseprof import analyze
row = analyze({str(trace)!r})["runs"][0]["workers"][0]["steps"][0]
print(json.dumps([list(row["phases"]), row["phases"]["loss"]["host_ms"]]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    phases, loss_ms = msgspec.json.decode(out)
    # in its place among the canonical phases; those with no time in the run (data, optimizer) not listed
    assert phases == ["forward", "backward", "loss", "other"]
    assert loss_ms == pytest.approx(0.1)


def test_findings_are_typed_with_the_figures_their_sentence_uses(tmp_path):
    from phaseprof.cli.report import report

    events = []
    for s in range(3):  # data loading takes 3 of each 10 ms step, forward 4
        t0 = s * 10_000
        events += [step(s + 1, t0, 10_000), annotation("## data ##", t0, 3_000),
                   annotation("## forward ##", t0 + 3_000, 4_000), op("aten::mm", t0 + 3_100, 3_000)]
    trace = write_trace(tmp_path / "w.1.pt.trace.json", events)
    summary = report(str(trace)).runs[0].workers[0].summary
    by_kind = {f.kind: f for f in summary.findings}
    top = summary.findings[0]
    assert (top.kind, top.phase) == ("host-time", "forward") and top.saving_ms == pytest.approx(4.0)
    assert top.share == pytest.approx(0.4) and "aten::mm (3.00 ms)" in top.text
    data = by_kind["data-loader"]
    assert data.phase == "data" and data.saving_ms == pytest.approx(3.0) and data.share == pytest.approx(0.3)
    assert data.text.startswith("data costs 3.00 ms of host time per step (30%)")
    assert "no-gpu" in by_kind
    # the JSON leaves out the figures a finding does not use (no GPU figures on a CPU-only run); the data
    # phase holds no op: its 3 ms are untraced, the dataset's own Python
    assert msgspec.json.decode(msgspec.json.encode(data.evidence)) == {
        "measure": "host", "cost_ms": 3.0, "wall_ms": 10.0, "host_ms": 3.0, "untraced_ms": 3.0}
    assert "3.00 ms of it (100%) records no op" in data.text


def test_the_tab_colours_a_users_phase_as_the_terminal_does():
    """The FNV-1a hash that picks a user phase's colour is written twice, in Python (the terminal)
    and TypeScript (the tab, frontend/src/phase_colours.ts): run the TypeScript's function in node on
    names of every kind and compare."""
    import json
    import re
    import shutil
    import subprocess

    names = ["loss", "mine", "phaseprof", "data_aug", "ÉTAPE", "é", "\U0001f600", "日本語", "", " ", "a" * 300,
             "x\u0000y", "\ud800", "forward2", "Forward", "compile"] + [f"phase{n}" for n in range(64)]
    source = (ROOT / "frontend" / "src" / "phase_colours.ts").read_text()
    function = source[source.index("export function phaseColour"):]
    function = function.replace("export ", "", 1)
    function = re.sub(r"\((\w+): string\): string", r"(\1)", function)  # the TypeScript's only annotations
    program = (f"let canonical = new Map(); let palette = {json.dumps(list(USER_PHASE_COLOURS))};\n{function}\n"
               f"process.stdout.write(JSON.stringify({json.dumps(names)}.map(phaseColour)));")
    node = shutil.which("node")
    assert node, "node is needed to run the tab's TypeScript (it builds the bundle too)"
    out = subprocess.run([node, "-e", program], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [phase_colour(n) for n in names]
    assert len(set(json.loads(out.stdout))) == len(USER_PHASE_COLOURS)  # the names spread over the palette
