"""Mutation testing of one module of the analysis core: ``python tests/mutation.py noise`` prints its score.

Why a script: mutmut (3.x) names each mutant after its file's path and switches it on by the module's
import name, so the two must agree: ``phaseprof/plugin/analysis/cost.py`` for
``phaseprof.plugin.analysis.cost``. The tree keeps that module in ``plugin/analysis/cost.py``
(setup.py's ``package_dir`` maps ``plugin/`` onto ``phaseprof.plugin`` and ``training_hooks/`` onto
``phaseprof.training_hooks``), and the editable install would hand the tests the unmutated original.
So this script lays the package out as it is imported, in ``.mutation/<module>/`` (copies of
``phaseprof/``, ``plugin/`` as ``phaseprof/plugin/``, ``training_hooks/`` as
``phaseprof/training_hooks/``, ``tests/`` and ``pyproject.toml``), adds the module's own settings to
the ``[tool.mutmut]`` table of that copy (the one file to mutate, the fast tests that exercise it),
runs ``mutmut run`` there and prints the score. mutmut's working files (``mutants/``, its caches) stay
in that folder between runs, so a second run only tests the mutants of functions that changed, and
retests the survivors of the previous run against the tests as they are now. ``--fresh`` starts over.

Score: killed / (mutants - equivalent ones), where the equivalent survivors (no observable
difference) are listed with a reason in docs/mutation-equivalents.md; a mutant no selected test
reaches, one that timed out or one mutmut found suspicious counts as not killed. See docs/testing.md.

Heavy: run it under ``nice -n 10``, one module at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / ".mutation"
EQUIVALENTS = ROOT / "docs" / "mutation-equivalents.md"

#: Module -> (its file as imported, the fast tests that exercise it: files and pytest options).
#: ``noise`` is the noise rule itself (``phaseprof/noise.py``); ``plugin/analysis/noise.py`` only re-exports it.
MODULES: dict[str, tuple[str, list[str]]] = {
    "noise": ("phaseprof/noise.py", ["tests/test_noise.py"]),
    "cost": ("phaseprof/plugin/analysis/cost.py", ["tests/test_cost.py"]),
    # the statistics' tests, not the command's (a subprocess per test, and what they check is held here)
    "regression": ("phaseprof/plugin/analysis/regression.py",
                   ["tests/test_compare.py", "-k", "bootstrap or quantile or welch or drift or weigh or confidence or "
                    "full or whole_interval or under_a_millisecond or absent or fewer or same_inputs or logged or "
                    "degrees or upper_bound or warn_nothing"]),
    # hand-built traces and recorded ones; not the tests that run a real training loop first
    "partition": ("phaseprof/plugin/analysis/partition.py",
                  ["tests/test_phases.py", "tests/test_inferred_steps.py", "tests/test_kept_apart.py",
                   "-k", "not real_loop and not autograd_profiler_around"]),
    "steps": ("phaseprof/plugin/analysis/steps.py",
              ["tests/test_phases.py", "tests/test_kept_apart.py", "-k", "not real_loop"]),
    "advice": ("phaseprof/plugin/analysis/advice.py", ["tests/test_advice.py", "tests/test_findings.py"]),
    "findings": ("phaseprof/plugin/analysis/findings.py",
                 ["tests/test_findings.py", "tests/test_warmup.py",
                  "tests/test_kept_apart.py::test_compile_time_is_a_compile_phase_and_compiling_steps_are_left_out_"
                  "of_the_summary",
                  "tests/test_kept_apart.py::test_summary_slowest_step_and_findings_leave_the_time_kept_apart_out",
                  "tests/test_gpu_measures.py::test_a_gpu_bound_step_is_measured_by_the_gpu"]),
    # not the route-against-report test of the kernel table: both sides run the same (mutated) analysis
    "span": ("phaseprof/plugin/analysis/span.py",
             ["tests/test_phases.py", "tests/test_gpu_measures.py", "tests/test_kernel_table.py",
              "tests/test_reading.py::test_bad_input_gives_one_line_naming_the_file_and_the_rest_is_reported",
              "-k", "not the_route_serves_the_same_table_as_the_report"]),
    "whole_run": ("phaseprof/plugin/analysis/whole_run.py", ["tests/test_whole_run_figures.py"]),
    # the hooks' and the tracker's unit tests (tiny models, no profiler): test_training_hooks.py runs
    # real loops with torch.profiler, about a minute per mutant on a loaded machine
    "tracker": ("phaseprof/training_hooks/tracker.py", ["tests/test_tracker.py", "tests/test_hooks.py"]),
    "hooks": ("phaseprof/training_hooks/hooks.py", ["tests/test_hooks.py"]),
    # the cache's own tests and the two of a bucket's entries (batches, copies kept in the user's
    # cache); not the fuzz, step index and other object-store tests, whole analyses a mutant
    "cache": ("phaseprof/plugin/cache.py",
              ["tests/test_cache.py",
               "tests/test_object_storage.py::test_tensorboard_loads_a_bucket_s_analyses_batch_after_"
               "batch_without_a_trace",
               "tests/test_object_storage.py::test_a_second_start_on_a_bucket_lists_it_and_fetches_no_"
               "analysis_again"]),
    # its own unit tests: the training loops that also run these models take seconds a test
    "models": ("phaseprof/training_hooks/models.py", ["tests/test_models.py"]),
    # the demo in-process, 13 steps in one test; not the CLI's test, in a subprocess
    "demo": ("phaseprof/training_hooks/demo.py", ["tests/test_demo.py"]),
    # its unit tests, and the hooks' (which patch through it); not the framework callbacks' (a
    # Trainer each)
    "wrapping": ("phaseprof/training_hooks/integrations/wrapping.py",
                 ["tests/test_wrapping.py", "tests/test_hooks.py"]),
    # its unit tests (a stand-in for Popen); not the file's real loops, each with real processes
    "source_analysis": ("phaseprof/training_hooks/source_analysis.py",
                        ["tests/test_source_analysis.py", "-k",
                         "not (each_trace_is_analysed or off_with_a_flag or loop_exports or "
                         "no_process_can_start)"]),
    # its fast tests: a tiny module, a few steps on a real Trainer each (the others are slow)
    "lightning": ("phaseprof/training_hooks/integrations/lightning.py", ["tests/test_lightning.py"]),
    # its fast tests: a tiny model, a few steps on a real Trainer each (the others are slow)
    "transformers": ("phaseprof/training_hooks/integrations/transformers.py",
                     ["tests/test_transformers.py"]),
}

#: Where each folder of the tree lies in the package as imported.
LAYOUT = {"phaseprof": "phaseprof", "plugin": "phaseprof/plugin", "training_hooks": "phaseprof/training_hooks"}
#: Beside `MODULES`, every module of these (tree paths: a folder's own files, or one file) can be
#: mutated, against the fast tests of every test file that imports it (`_importers`).
REACH = ("plugin/analysis", "plugin/reading", "plugin/cache.py", "plugin/step_index.py", "training_hooks",
         "training_hooks/integrations", "phaseprof/capture_channel.py")


def accepted() -> dict[str, tuple[str, list[str]]]:
    """Every module this script mutates: name -> (its file as imported, its tests). `MODULES` as
    written; each other module of `REACH` by its file's stem (``folder.stem`` where two share one),
    tested by the test files that import it."""
    files = []
    for entry in REACH:
        path = ROOT / entry
        files += [path] if path.is_file() else sorted(p for p in path.glob("*.py") if p.name != "__init__.py")
    imported = {_imported_path(f) for f in files}
    known = {path for path, _ in MODULES.values()}
    stems = [Path(p).stem for p in imported]
    out = dict(MODULES)
    for path in sorted(imported - known):
        stem = Path(path).stem
        name = stem if stems.count(stem) == 1 and stem not in out else f"{Path(path).parent.name}.{stem}"
        out[name] = (path, _importers(path))
    return out


def _imported_path(file: Path) -> str:
    """A tree file's path as imported (``plugin/cache.py`` -> ``phaseprof/plugin/cache.py``)."""
    rel = file.relative_to(ROOT).as_posix()
    for folder, target in sorted(LAYOUT.items(), key=lambda kv: -len(kv[0])):
        if rel.startswith(folder + "/"):
            return target + rel[len(folder):]
    raise ValueError(rel)


def _importers(path: str) -> list[str]:
    """The test files that import the module of ``path`` (by its dotted name, or ``from <package>
    import <module>``); where none does, those that import from its package (a module reached only
    through others, like most of the analysis). Sorted; none at all is an error the run reports."""
    dotted = path[:-3].replace("/", ".")
    package, _, module = dotted.rpartition(".")
    tests = {p: p.read_text(encoding="utf-8") for p in (ROOT / "tests").glob("test_*.py")}
    for pattern in (rf"\b{re.escape(dotted)}\b|from {re.escape(package)} import [^\n]*\b{module}\b",
                    rf"\b{re.escape(package)}\b"):
        found = sorted(f"tests/{p.name}" for p, text in tests.items() if re.search(pattern, text))
        if found:
            return found
    return []
_SKIP = shutil.ignore_patterns("__pycache__", ".phaseprof", "*.pyc")


def stage(module: str, fresh: bool) -> Path:
    """The package laid out as imported, with the module's mutmut settings, in ``.mutation/<module>/``."""
    path, tests = accepted()[module]
    if not tests:
        raise SystemExit(f"mutation: no test file imports {path}: nothing can kill its mutants")
    where = STAGE / module
    if fresh and where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True, exist_ok=True)
    for entry in where.iterdir():  # mutmut's own files stay; the copies are made afresh
        if entry.name != "mutants":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for folder, target in LAYOUT.items():
        # copy2 keeps modification times: mutmut regenerates a file's mutants only when its source is newer
        shutil.copytree(ROOT / folder, where / target, ignore=_SKIP, copy_function=shutil.copy2,
                        dirs_exist_ok=True)
    shutil.copytree(ROOT / "tests", where / "tests", ignore=_SKIP, copy_function=shutil.copy2)
    missing = [t for t in tests if t.startswith("tests/") and not (where / t.split("::")[0]).exists()]
    if missing:
        raise SystemExit(f"mutation: the tests of {module} are missing: {', '.join(missing)}")
    (where / "pyproject.toml").write_text(_pyproject(path, tests), encoding="utf-8")
    return where


def _pyproject(path: str, tests: list[str]) -> str:
    """The project's pyproject.toml with its ``[tool.mutmut]`` table narrowed to one file and its tests."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    settings = tomllib.loads(text)["tool"]["mutmut"]
    settings["only_mutate"] = [path]
    settings["pytest_add_cli_args_test_selection"] = tests
    table = "[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
    text = re.sub(r"^\[tool\.mutmut\]\n(?:(?!\[).*\n)*", lambda _: table + "\n", text, flags=re.M)
    assert tomllib.loads(text)["tool"]["mutmut"] == settings, "the [tool.mutmut] table was not rewritten whole"
    return text


def results(where: Path, path: str) -> dict[str, str]:
    """Mutant name -> status (killed, survived, no tests, timeout, ...) from mutmut's record of ``path``."""
    from mutmut.stats import status_by_exit_code

    meta = where / "mutants" / (path + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in codes.items()}


def equivalents() -> dict[str, str]:
    """Mutant name -> why it is equivalent, from the list in docs (lines ``- `name`: reason``)."""
    if not EQUIVALENTS.exists():
        return {}
    found = re.findall(r"^- `([^`]+__mutmut_\d+)`:\s*(.+)$", EQUIVALENTS.read_text(encoding="utf-8"), flags=re.M)
    return dict(found)


def sample(path: str, count: int) -> list[str]:
    """``count`` of the module's mutant names, drawn with a fixed seed (the same ones every time)."""
    import random

    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    source = (ROOT / _tree_path(path)).read_text(encoding="utf-8")
    names = [get_mutant_name(Path(path), n) for n in mutate_file_contents(path, source).mutant_names]
    return sorted(random.Random(0).sample(names, min(count, len(names))))


def _tree_path(path: str) -> str:
    """Where the file of ``path`` (as imported) lies in the tree."""
    for folder, target in sorted(LAYOUT.items(), key=lambda kv: -len(kv[1])):
        if path.startswith(target + "/"):
            return folder + path[len(target):]
    raise ValueError(path)


def mutmut(where: Path, *args: str) -> None:
    env = dict(os.environ, PHASEPROF_CACHE="off")  # never an analysis cached under another mutant
    done = subprocess.run([sys.executable, "-m", "mutmut", "run", *args], cwd=where, env=env)
    if done.returncode:
        raise SystemExit(f"mutation: mutmut exited {done.returncode} in {where}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("module", choices=sorted(accepted()), help="the module to mutate")
    parser.add_argument("--fresh", action="store_true", help="forget mutmut's results of earlier runs")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--show", action="store_true", help="print the diff of every survivor not listed as equivalent")
    parser.add_argument("--report-only", action="store_true", help="print the last run's score, run nothing")
    parser.add_argument("--sample", type=int, metavar="N",
                        help="test N of the module's mutants, drawn with a fixed seed (a module of thousands)")
    args = parser.parse_args(argv)
    path, _ = accepted()[args.module]
    where = STAGE / args.module
    if not args.report_only:
        before = {} if args.fresh else results(where, path)  # --fresh: no earlier verdict counts
        where = stage(args.module, args.fresh)
        # a sample already run: only its mutants not killed yet
        drawn = [n for n in sample(path, args.sample) if before.get(n) != "killed"] if args.sample else []
        if not args.sample or drawn:
            mutmut(where, "--max-children", str(args.max_children), *drawn)
        # survivors of an earlier run keep their verdict in mutmut's record (it retests a mutant only
        # when its function changed): retest the ones still not killed against the tests as they are now
        now = results(where, path)
        again = [name for name, status in before.items()
                 if status not in ("killed", "not checked") and now.get(name, "killed") not in ("killed", "not checked")
                 and name not in drawn]
        if again:
            mutmut(where, "--max-children", str(args.max_children), *again)
    status = {name: s for name, s in results(where, path).items() if s != "not checked"}
    total = len(results(where, path))
    if not status:
        raise SystemExit(f"mutation: no results for {args.module}; run it without --report-only")
    listed = equivalents()
    survivors = sorted(name for name, s in status.items() if s != "killed")
    equivalent = [name for name in survivors if name in listed]
    killed = sum(s == "killed" for s in status.values())
    generated = results(where, path)
    stale = sorted(name for name in listed if name.startswith(path[:-3].replace("/", ".") + ".")
                   and generated.get(name, "no longer a mutant") not in ("survived", "not checked"))
    counts = {s: sum(v == s for v in status.values()) for s in sorted(set(status.values()))}
    score = killed / (len(status) - len(equivalent)) if len(status) > len(equivalent) else 1.0
    checked = f"{len(status)} of {total} mutants checked" if len(status) < total else f"{total} mutants"
    print(f"\n{args.module} ({path}): {checked}, " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    print(f"equivalent (docs/mutation-equivalents.md): {len(equivalent)}")
    print(f"score: {killed} / ({len(status)} - {len(equivalent)}) = {score:.1%}")
    for name in stale:
        print(f"listed as equivalent but {generated.get(name, 'no longer a mutant')}: {name}")
    for name in survivors:
        if name in listed:
            continue
        print(f"{status[name]}: {name}")
        if args.show:
            subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
