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

#: The fast tests of reading a file: test_hostile_input's and test_reading's, without those that
#: read every trace of tests/data or start loader processes (seconds each), and test_trace_facts.
_READING = ["tests/test_hostile_input.py", "tests/test_reading.py", "tests/test_trace_facts.py",
            "-k", "not hangs_or_kills and not slow_to_start and not large_file_on_two_cores and "
            "not no_route_answers and not string_hash_seed and not every_trace_in_the_test_data "
            "and "
            "not every_op_row and not typed_pass_reads_every and not two_process_decode"]

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
    # the names' unit tests: partition's tests (which read every name through it) kill all 15 too,
    # at about 40 s a mutant
    "names": ("phaseprof/plugin/analysis/names.py", ["tests/test_names.py"]),
    # against closed forms and mpmath, and test_compare's table values (not its Welch tests: a
    # resampling each, and what they need of it is the quantile these check)
    "student_t": ("phaseprof/plugin/analysis/student_t.py",
                  ["tests/test_student_t.py", "tests/test_compare.py::test_the_t_quantile_is_exact",
                   "tests/test_compare.py::test_the_t_quantile_holds_for_any_degrees_of_freedom"]),
    # the answer from capture folders built in memory; the route's tests on real folders
    # (test_capture_channel: `-k the_route or ...`) scored 95% of the same 40, at 15 s a mutant
    "captures": ("phaseprof/plugin/analysis/captures.py", ["tests/test_captures.py"]),
    # the comparison's unit tests on a hand-built loop; its callers' tests (the /compare route, the
    # slowest step of a summary, the facade) analyse whole logdirs, a minute or more a mutant
    "compare": ("phaseprof/plugin/analysis/compare.py",
                ["tests/test_compare.py", "-k",
                 "mean_step_over or a_comparison_ or changed_ops_fill or median_step_is or grew_most or "
                 "median_of_steps"]),
    # each table's rows of a step on a hand-built span, and the empty tables; span's and steps'
    # tests read every table too, at about 40 s a mutant
    "model": ("phaseprof/plugin/analysis/model.py", ["tests/test_model.py"]),
    # the rule's tests on hand-built loops and against judging each step apart; not the tests on
    # recorded traces (a whole analysis each, 20 s of setup)
    "warmup": ("phaseprof/plugin/analysis/warmup.py",
               ["tests/test_warmup.py", "-k",
                "first_step or setup_calls or rule_from_one_sort or judging_more or compiling_steps or "
                "numpy_s_for_every or exactly_half or enough_to_judge or under_a_microsecond"]),
    # the rank table's tests on built and recorded jobs (not test_plugin's, through a served logdir);
    # "ranks" selects all of test_ranks.py
    "ranks": ("phaseprof/plugin/analysis/ranks.py",
              ["tests/test_ranks.py", "tests/test_gpu_measures.py", "tests/test_findings.py", "-k",
               "ranks or straggler or world_of_two or not_ranks"]),
    # the ranges in a small real profile and NVTX through a stand-in: no training loop
    "ranges": ("phaseprof/training_hooks/ranges.py", ["tests/test_ranges.py"]),
    # a real SIGTERM raised in-process, the default action's os.kill stood in for: no job to start
    "signals": ("phaseprof/training_hooks/signals.py", ["tests/test_signals.py"]),
    # a small real profile handed to the writer, its background finishing each trace in-process
    "traces": ("phaseprof/training_hooks/traces.py", ["tests/test_traces.py"]),
    # hand-made steps, the scalars read back, a full disk through a stand-in os.write; and the
    # records' framing against TensorBoard's writer (not the rest of test_training_hooks: loops)
    "recorder": ("phaseprof/training_hooks/recorder.py",
                 ["tests/test_recorder.py",
                  "tests/test_training_hooks.py::test_the_scalars_records_carry_tensorboards_checksums"]),
    # the watcher and its plans on a fake clock with a small real profiler, in-process; not
    # test_capture (a job a test, all slow) nor test_capture_store (the store's wire)
    "capture": ("phaseprof/training_hooks/capture.py", ["tests/test_capture_watcher.py"]),
    # a tiny model's loop, plain JSON traces, no background analysis; not test_training_hooks
    # (the README's loop with the defaults: three minutes a mutant on a loaded machine)
    "profiler": ("phaseprof/training_hooks/profiler.py", ["tests/test_profiler.py"]),
    # the cache's own tests and the two of a bucket's entries (batches, copies kept in the user's
    # cache); not the fuzz, step index and other object-store tests, whole analyses a mutant
    "cache": ("phaseprof/plugin/cache.py",
              ["tests/test_cache.py",
               "tests/test_object_storage.py::test_tensorboard_loads_a_bucket_s_analyses_batch_after_"
               "batch_without_a_trace",
               "tests/test_object_storage.py::test_a_second_start_on_a_bucket_lists_it_and_fetches_no_"
               "analysis_again"]),
    # the fast reading tests (`_READING`) and the module's own
    "columns": ("phaseprof/plugin/reading/columns.py", ["tests/test_columns.py", *_READING]),
    "decode": ("phaseprof/plugin/reading/decode.py", ["tests/test_decode.py", *_READING]),
    # launch shapes and memory device labels: its own unit tests (every read packs a shape)
    "events": ("phaseprof/plugin/reading/events.py", ["tests/test_events.py"]),
    # the one-line errors of test_decode and the trip between processes
    "errors": ("phaseprof/plugin/reading/errors.py",
               ["tests/test_decode.py",
                "tests/test_reading.py::test_trace_error_survives_pickling_between_processes"]),
    # the line of a file read in part: its own tests and those of the reasons counted while reading
    "problems": ("phaseprof/plugin/reading/problems.py",
                 ["tests/test_problems.py", "tests/test_columns.py", "tests/test_lenient.py"]),
    # in-process reads of files the typed pass refuses (test_hostile_input's go through `analyze`)
    "lenient": ("phaseprof/plugin/reading/lenient.py",
                ["tests/test_lenient.py", "tests/test_trace_facts.py", "tests/test_columns.py"]),
    # its own tests, test_decode's two halves, and the split tests of test_reading and
    # test_hostile_input
    "split": ("phaseprof/plugin/reading/split.py",
              ["tests/test_split.py", "tests/test_decode.py",
               "tests/test_reading.py::test_a_split_that_is_not_between_events_falls_back_to_one_"
               "process",
               "tests/test_hostile_input.py::test_a_decode_error_in_a_split_plain_file_is_reported_"
               "not_masked"]),
    # the structs are made at import: only a test that makes them again reaches a mutant
    "trace_fields": ("phaseprof/plugin/reading/trace_fields.py", ["tests/test_trace_fields.py"]),
    # its own tests (on disk and in fsspec's memory store) and test_reading's two of discovery
    "discovery": ("phaseprof/plugin/reading/discovery.py",
                  ["tests/test_discovery.py",
                   "tests/test_reading.py::test_discovery_finds_runs_workers_and_spans",
                   "tests/test_reading.py::test_symlink_leading_outside_the_logdir_is_not_read"]),
    # its own tests, and the files test_decode cannot read (test_hostile_input's go through
    # `analyze`)
    "file_bytes": ("phaseprof/plugin/reading/file_bytes.py",
                   ["tests/test_file_bytes.py", "tests/test_decode.py",
                    "tests/test_hostile_input.py::test_budgets_are_configurable"]),
    # the reader's own tests (event files written in-process, local and on fsspec's memory store)
    # and the whole run's cut-short one; not test_whole_run's others (a training loop, the CLI)
    "scalars": ("phaseprof/plugin/reading/scalars.py",
                ["tests/test_scalars.py",
                 "tests/test_whole_run.py::test_scalar_reader_stops_at_a_record_cut_short_and_later_"
                 "files_win"]),
    # the store's own tests (fsspec's memory store in-process; S3 on moto where only S3 does it)
    # and two of a bucket's listing; not the object-store tests that analyse traces or start
    # TensorBoard
    "storage": ("phaseprof/plugin/reading/storage.py",
                ["tests/test_storage.py",
                 "tests/test_object_storage.py::test_nothing_outside_the_logdir_is_listed",
                 "tests/test_object_storage.py::test_keys_outside_the_prefix_or_through_odd_"
                 "segments_are_refused"]),
    # its unit tests, the idle split of a built step and of the two small GPU traces against HTA's
    # rules in plain Python (the larger traces' cases take seconds each and check the same rules)
    "idle": ("phaseprof/plugin/analysis/idle.py",
             ["tests/test_idle.py",
              "tests/test_critical_path.py::test_the_idle_split_of_a_step_built_to_know_it",
              "tests/test_critical_path.py::test_the_idle_split_follows_htas_rules_and_adds_up_"
              "to_each_streams_idle_time[hta_alexnet_2stream]",
              "tests/test_critical_path.py::test_the_idle_split_follows_htas_rules_and_adds_up_"
              "to_each_streams_idle_time[hta_event_sync_3stream]"]),
    # its unit tests and the two built last steps of test_cut_step (not its cut ResNet-50 trace,
    # nor every trace of tests/data)
    "cut": ("phaseprof/plugin/analysis/cut.py",
            ["tests/test_cut.py", "tests/test_cut_step.py", "-k",
             "not test_cut_step or closes_before_its_gpu_work or ends_with_the_trace_after_only"]),
    # its unit tests and the two built loops of test_findings whose untraced time is known (not its
    # real traces)
    "untraced": ("phaseprof/plugin/analysis/untraced.py",
                 ["tests/test_untraced.py", "tests/test_findings.py", "-k", "untraced"]),
    # its unit tests and the two of the timeline route (TensorBoard's scalars in a test client)
    "timeline": ("phaseprof/plugin/analysis/timeline.py",
                 ["tests/test_timeline.py",
                  "tests/test_plugin.py::test_timeline_reads_every_step_from_the_scalars_and_"
                  "marks_profiled_windows",
                  "tests/test_kept_apart.py::test_the_timeline_carries_evaluation_and_the_"
                  "profilers_own_time_apart"]),
    # its unit tests and the memory routes' tests on recorded traces; not every analysis of a trace
    "memory": ("phaseprof/plugin/analysis/memory.py",
               ["tests/test_memory.py", "tests/test_below_phases.py", "-k", "memory"]),
    # its unit tests and the span tests of nesting at float resolution and of ops sharing a start
    "nesting": ("phaseprof/plugin/analysis/nesting.py",
                ["tests/test_nesting.py", "tests/test_phases.py", "-k",
                 "test_nesting or float_resolution or one_start or thread_time_order"]),
    # its unit tests (hand-built loops), the route's totals against the steps' and the cut step
    "operators": ("phaseprof/plugin/analysis/operators.py",
                  ["tests/test_operators.py",
                   "tests/test_below_phases.py::test_ops_totals_equal_the_sum_over_steps",
                   "tests/test_cut_step.py::test_the_run_wide_tables_leave_the_cut_step_out_and_"
                   "say_so"]),
    # its unit tests on hand-placed frames, and the user-frame test (test_modules' others train)
    "stacks": ("phaseprof/plugin/analysis/stacks.py",
               ["tests/test_stacks.py",
                "tests/test_modules.py::test_user_frames_skip_torch_the_standard_library_and_"
                "builtins"]),
    # its documents of hand-built steps, the evaluation pass's; not the step index's (whole traces)
    "step_trace": ("phaseprof/plugin/analysis/step_trace.py",
                   ["tests/test_step_trace.py",
                    "tests/test_phases.py::test_the_step_trace_labels_host_events_of_an_"
                    "evaluation_pass_apart_from_the_step"]),
    # the ranges under torch.profiler, in-process; test_modules trains a model with them first
    "module_ranges": ("phaseprof/training_hooks/module_ranges.py",
                      ["tests/test_module_ranges.py"]),
    # test_modules' hand-built traces (its others train a model first, and one of them compares
    # times within 1%, which a loaded machine can miss), the cache's entry with module calls, and
    # the run-wide table leaving the warm-up step out
    "modules": ("phaseprof/plugin/analysis/modules.py",
                ["tests/test_modules.py", "tests/test_cache.py", "tests/test_warmup.py", "-k",
                 "built or deeper_than_the_longest or module_depths or gpu_time_of_a_modules or "
                 "an_entry_with_call_paths_and_modules or run_wide_tables_leave_the_warmup"]),
    # its own unit tests: the training loops that also run these models take seconds a test
    "models": ("phaseprof/training_hooks/models.py", ["tests/test_models.py"]),
    # the faults' own tests (the warning and the summary's lines); not its importers, which start
    # S3 servers and training processes to report through it
    "faults": ("phaseprof/training_hooks/faults.py", ["tests/test_faults.py"]),
    # the summary printed on close, from step figures built by hand; no other fast test prints it
    "summary": ("phaseprof/training_hooks/summary.py", ["tests/test_summary.py"]),
    # the uploads in-process, to fsspec's memory store under a scheme of its own that refuses as
    # told; test_object_storage_writing runs them against S3 in the uploader's process (slow)
    "upload": ("phaseprof/training_hooks/upload.py", ["tests/test_upload.py"]),
    # its own tests and the summaries of built loops (findings, time kept apart); not the tests that
    # read real traces or run a real loop, nor test_blocking (its importer: HTA's 16-rank trace)
    "worker_summary": ("phaseprof/plugin/analysis/worker_summary.py",
                       ["tests/test_worker_summary.py", "tests/test_findings.py",
                        "tests/test_kept_apart.py", "-k",
                        "not every_gpu_case and not resnet50 and not first_finding and "
                        "not real_loop and not hta_v100 and not two_rank_sampled"]),
    # its own tests and the four built steps of test_critical_path whose paths are known (not its
    # real trace's what-if bound nor its idle split against HTA over every GPU trace)
    "path_summary": ("phaseprof/plugin/analysis/path_summary.py",
                     ["tests/test_path_summary.py", "tests/test_critical_path.py", "-k",
                      "test_path_summary or data_stall or blocking_copy or gpu_bound_step or "
                      "exposed_all_reduce"]),
    # the built steps of test_blocking and test_critical_path's blocking copy (not HTA's 16-rank
    # trace nor every GPU trace of tests/data)
    "blocking": ("phaseprof/plugin/analysis/blocking.py",
                 ["tests/test_blocking.py", "tests/test_critical_path.py", "-k",
                  "item_in_forward or returns_before or launch_queue_and_delay or no_known_launch or "
                  "blocking_copy or two_traces or inputs_are or first_device_event or weighed_by "
                  "or still_waiting"]),
    # the built steps of test_critical_path and test_blocking whose paths and calls are known (not
    # the what-if bound on a real trace nor the idle split over every GPU trace)
    "critical_path": ("phaseprof/plugin/analysis/critical_path.py",
                      ["tests/test_critical_path.py", "tests/test_blocking.py", "-k",
                       "data_stall or blocking_copy or gpu_bound_step or exposed_all_reduce or "
                       "built_to_know_it or item_in_forward or returns_before or little_before or "
                       "launch_call_on or no_known_launch or second_stream or before_any_device or "
                       "launched_in_the_step or autograds_thread"]),
    # the worker's unit tests on hand-built trace files, and warmup's on hand-built loops (through
    # a whole summary); "test_worker" selects all of test_worker.py. Its other importers analyse
    # recorded traces or run real loops, a minute or more a mutant
    "worker": ("phaseprof/plugin/analysis/worker.py",
               ["tests/test_worker.py", "tests/test_warmup.py", "-k",
                "test_worker or first_step or setup_calls or compiling_steps"]),
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
