/**
 * The tab: a toolbar (views, run, worker, CPU or GPU), loading progress and unreadable files, and
 * the pane of the current view. Selections live in the URL hash; the runs are asked again when
 * TensorBoard reloads, and every moment while traces are still loading.
 */

import { Api } from './api';
import { segmented, select } from './components/controls';
import { failure, loading, notice } from './components/status';
import { el, replace } from './dom';
import { bytes } from './format';
import { usePhaseColours } from './phase_colours';
import { Scope } from './scope';
import { Store, VIEWS, type State, type View as ViewName } from './state';
import { onTensorBoardReload } from './tensorboard';
import { watchTheme } from './theme';
import type { RunInfo, RunsAnswer } from './types';
import { UrlHash } from './url_hash';
import { collectives } from './views/collectives';
import { compare } from './views/compare';
import { memoryEvents } from './views/memory_events';
import { overview } from './views/overview';
import { ranks } from './views/ranks';
import { operators } from './views/operators';
import { modules } from './views/modules';
import { step } from './views/step';
import { timeline } from './views/timeline';
import { defaultWorker, findRun, type View } from './views/view';

const VIEW_OF: Record<ViewName, View> = {
  overview, timeline, step, operators, modules, compare, ranks, collectives, memory: memoryEvents,
};
const POLL_MS = 1500;
const EMPTY_POLL_MS = 6000;

/** Which toolbar inputs each view reads. */
const USES: Record<ViewName, { worker: boolean; run: boolean; device: boolean }> = {
  overview: { run: true, worker: true, device: true },
  timeline: { run: true, worker: false, device: true },
  step: { run: true, worker: true, device: false },
  operators: { run: true, worker: true, device: false },
  modules: { run: true, worker: true, device: false },
  compare: { run: false, worker: false, device: true },
  ranks: { run: true, worker: false, device: true },
  collectives: { run: true, worker: false, device: false },
  memory: { run: true, worker: true, device: false },
};

export class App {
  private readonly api = new Api();
  private readonly store = new Store(new UrlHash());
  private readonly toolbar = el('nav', { class: 'toolbar' });
  private readonly notices = el('div', { class: 'notices' });
  private readonly pane = el('main', { class: 'pane' });
  private runs: RunsAnswer | null = null;
  private scope: Scope | null = null;
  /** The selections the pane was last drawn from. */
  private drawn: State | null = null;
  private poll: number | undefined;

  constructor(private readonly root: HTMLElement) {}

  async start(): Promise<void> {
    replace(this.root, this.toolbar, this.notices, this.pane);
    replace(this.pane, loading('Loading runs…'));
    watchTheme(() => this.render());
    onTensorBoardReload(() => void this.reload(true));
    this.store.subscribe((state) => this.changed(state));
    await this.reload(true);
  }

  /**
   * Ask for the runs again, and (when TensorBoard reloads, or the runs changed) for what the view
   * shows; draw again only what changed. While traces load, ask again every moment.
   */
  private async reload(recheckView: boolean): Promise<void> {
    window.clearTimeout(this.poll);
    let runs: RunsAnswer;
    try {
      runs = await this.api.runs();
    } catch (error) {
      if (!this.runs) replace(this.pane, failure('the runs', error));
      this.poll = window.setTimeout(() => void this.reload(true), POLL_MS * 4);
      return;
    }
    usePhaseColours(runs);
    const before = this.runs;
    const runsChanged = JSON.stringify(runs) !== JSON.stringify(before);
    this.runs = runs;
    // a logdir showing nothing yet (a store still being listed, or one that cannot be): asked
    // again now and then, so that its first runs, or why there are none, show without a reload
    const wait = stillLoading(runs) ? POLL_MS : runs.runs.length ? null : EMPTY_POLL_MS;
    if (wait !== null) this.poll = window.setTimeout(() => void this.reload(false), wait);
    if (!runsChanged && !recheckView) return;
    const dataChanged = await this.api.revalidate();
    if (runsChanged) this.drawNotices(runs);
    const fixes = this.fixSelection(this.store.state, runs);
    if (Object.keys(fixes).length) this.store.set(fixes, { replace: true });
    else if (!before || dataChanged || !runs.runs.length) this.render();
    else if (shownRunsChanged(before, runs, this.store.state)) this.render();
    else if (runsChanged) this.drawToolbar(this.store.state, runs);
  }

  /** Selections the runs no longer hold (or none yet) replaced by the defaults. */
  private fixSelection(state: State, runs: RunsAnswer): Partial<State> {
    const fixes: Partial<State> = {};
    if (!runs.runs.length) return fixes;
    let run = findRun(runs, state.run);
    if (!run) {
      run = runs.runs.find((r) => r.workers.length) ?? runs.runs[0];
      fixes.run = run.run;
      fixes.step = null;
      if (!run.workers.length && state.view === 'overview') fixes.view = 'timeline';
    }
    if (!run.workers.some((w) => w.worker === state.worker)) {
      const worker = defaultWorker(run);
      if (worker !== state.worker) {
        fixes.worker = worker;
        if (state.worker) fixes.step = null; // a step of another worker; none named keeps the step
      }
    }
    return fixes;
  }

  private changed(state: State): void {
    if (this.runs) {
      const fixes = this.fixSelection(state, this.runs);
      if (Object.keys(fixes).length) {
        this.store.set(fixes, { replace: true }); // heard again, fixed
        return;
      }
    }
    const drawn = this.drawn;
    const keys = VIEW_OF[state.view].keys;
    if (!drawn || state.view !== drawn.view || keys.some((key) => JSON.stringify(state[key]) !== JSON.stringify(drawn[key]))) {
      this.render();
    } else {
      this.drawToolbar(state, this.runs);
    }
  }

  private render(): void {
    this.scope?.dispose();
    const runs = this.runs;
    const state = (this.drawn = this.store.state);
    this.drawToolbar(state, runs);
    if (!runs) return;
    if (!runs.runs.length) {
      this.scope = null;
      replace(this.pane, runs.logdir_error ? unlisted(runs.logdir_error) : emptyLogdir(runs));
      return;
    }
    const scope = (this.scope = new Scope());
    this.api.newView();
    const root = el('div', { class: `view view-${state.view}` });
    replace(this.pane, root);
    void VIEW_OF[state.view].render({ root, state, runs, api: this.api, scope, go: (patch, navigation) => this.store.set(patch, navigation) });
  }

  private drawToolbar(state: State, runs: RunsAnswer | null): void {
    const uses = USES[state.view];
    const run = runs ? findRun(runs, state.run) : undefined;
    const go = (patch: Partial<State>) => this.store.set(patch);
    replace(
      this.toolbar,
      segmented(
        'View',
        VIEWS.map((v) => ({ value: v.view, label: v.label })),
        state.view,
        (view) => go({ view: view as ViewName }),
      ),
      el(
        'div',
        { class: 'toolbar-inputs' },
        uses.run && runs?.runs.length
          ? select(
              'Run',
              runs.runs.map((r) => ({ value: r.run, label: r.workers.length ? r.run : `${r.run} (timings only)` })),
              state.run,
              (value) => go({ run: value, worker: '', step: null, from: null, to: null }),
            )
          : null,
        uses.worker && run && run.workers.length > 1
          ? select(
              'Worker',
              run.workers.map((w) => ({ value: w.worker, label: w.rank === null ? w.worker : `${w.worker} (rank ${w.rank})` })),
              state.worker,
              (value) => go({ worker: value, step: null }),
            )
          : null,
        uses.device
          ? segmented(
              'Time',
              [
                { value: 'cpu', label: 'CPU', title: 'Host time of each phase' },
                noDevice(run)
                  ? { value: 'gpu', label: 'GPU', title: 'No GPU activity in the traces of this run', disabled: true }
                  : { value: 'gpu', label: 'GPU', title: 'Device time of the work each phase launched' },
              ],
              noDevice(run) ? 'cpu' : state.device,
              (device) => go({ device: device === 'gpu' ? 'gpu' : 'cpu' }),
            )
          : null,
      ),
    );
  }

  private drawNotices(runs: RunsAnswer): void {
    const { files, done, bytes: total, bytes_done } = runs.loading;
    replace(
      this.notices,
      done < files
        ? el(
            'div',
            { class: 'status loading', role: 'status' },
            el('span', { class: 'spinner' }),
            `Loading traces: ${done} of ${files} files (${bytes(bytes_done)} of ${bytes(total)}).`,
          )
        : null,
      runs.logdir_error && runs.runs.length // with no run, the pane says it
        ? el(
            'div',
            { class: 'status error', role: 'alert' },
            el('strong', null, 'The logdir cannot be listed now; '),
            `these runs are from its last listing. ${runs.logdir_error}`,
          )
        : null,
      runs.errors.length
        ? el(
            'details',
            { class: 'status error' },
            el('summary', null, `${runs.errors.length} trace file${runs.errors.length > 1 ? 's' : ''} could not be read`),
            el('ul', null, ...runs.errors.map((e) => el('li', null, el('code', null, e.path), `: ${e.error}`))),
          )
        : null,
    );
  }
}

/** Whether the runs the view shows (what they hold, how far they loaded) are not what they were. */
function shownRunsChanged(before: RunsAnswer, after: RunsAnswer, state: State): boolean {
  const names = new Set([state.run, state.a.run, state.b.run]);
  const shown = (runs: RunsAnswer) => JSON.stringify(runs.runs.filter((r) => names.has(r.run)));
  return shown(before) !== shown(after);
}

function stillLoading(runs: RunsAnswer): boolean {
  return runs.loading.done < runs.loading.files || runs.runs.some((r) => r.workers.some((w) => w.state === 'loading'));
}

function emptyLogdir(runs: RunsAnswer): HTMLElement {
  return notice(
    el('strong', null, 'No profiles under the logdir yet. '),
    runs.errors.length
      ? 'None of the trace files found could be read (see above). '
      : 'Add PhaseProfiler to a training loop (or run phaseprof demo) and point TensorBoard’s --logdir at its output; ',
    'new runs appear on reload.',
  );
}

/** In the run list's place: why the logdir cannot be listed (the extra, credentials, bucket). */
function unlisted(why: string): HTMLElement {
  const head = el('strong', null, 'The logdir cannot be read. ');
  return el('div', { class: 'status error logdir-error', role: 'alert' }, head, why);
}

/** A run whose traces are loaded and none holds device activity: its GPU view has nothing to show. */
function noDevice(run: RunInfo | undefined): boolean {
  const spans = run?.workers.flatMap((w) => w.spans) ?? [];
  return spans.length > 0 && spans.every((s) => s.state === 'error' || s.gpu === false) && spans.some((s) => s.gpu === false);
}
