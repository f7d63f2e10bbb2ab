/** What every view gets, and the helpers they share for fetching into their pane. */

import type { Api } from '../api';
import { failure, loading, notice } from '../components/status';
import { replace } from '../dom';
import type { Scope } from '../scope';
import type { Navigation, State } from '../state';
import type { Device, RunInfo, RunsAnswer, StepsAnswer } from '../types';

export interface ViewContext {
  /** The pane the view fills. */
  root: HTMLElement;
  state: State;
  runs: RunsAnswer;
  api: Api;
  scope: Scope;
  /** Change selections (they go to the URL hash); views listening on them are drawn again. */
  go: (patch: Partial<State>, navigation?: Navigation) => void;
}

export interface View {
  /** The selections the view is drawn from: a change to any of them draws it again. */
  keys: (keyof State)[];
  render: (ctx: ViewContext) => Promise<void>;
}

/** Show a loading line in `target` (the whole pane by default), then the answer; on failure, the error. */
export async function fetchInto<T>(
  ctx: ViewContext,
  what: string,
  request: () => Promise<T>,
  target: HTMLElement = ctx.root,
): Promise<T | null> {
  replace(target, loading(`Loading ${what}…`));
  try {
    const answer = await request();
    return ctx.scope.live ? answer : null;
  } catch (error) {
    if (ctx.scope.live) replace(target, failure(what, error));
    return null;
  }
}

export function findRun(runs: RunsAnswer, name: string): RunInfo | undefined {
  return runs.runs.find((r) => r.run === name);
}

/** The worker the API picks when none is named: the lowest rank, else the first by name. */
export function defaultWorker(run: RunInfo): string {
  const ranked = [...run.workers].sort(
    (x, y) =>
      Number(x.rank === null) - Number(y.rank === null) ||
      (x.rank ?? 0) - (y.rank ?? 0) ||
      (x.worker < y.worker ? -1 : x.worker > y.worker ? 1 : 0),
  );
  return ranked[0]?.worker ?? '';
}

/** A worker without steps to show: its traces are still loading (the app asks again), or hold none. */
export function noSteps(run: RunInfo | undefined, worker: string): HTMLElement {
  const loadingNow = run?.workers.find((w) => w.worker === worker)?.state === 'loading';
  return loadingNow ? loading(`The traces of ${worker} are still loading…`) : notice(`${worker} has no profiled steps.`);
}

/** A view of the selected worker's steps: `render` runs once they are in hand; without any, the
 * pane says why (`nothing`: what the view would have shown, e.g. "no ops to list"). */
export function overSteps(view: {
  keys: (keyof State)[];
  nothing: string;
  render: (ctx: ViewContext, steps: StepsAnswer) => Promise<void>;
}): View {
  return {
    keys: view.keys,
    async render(ctx) {
      const steps = await stepsToShow(ctx, view.nothing);
      if (steps) await view.render(ctx, steps);
    },
  };
}

/** The steps of the selected run and worker; null once the pane says why there are none to show. */
async function stepsToShow(ctx: ViewContext, nothing: string): Promise<StepsAnswer | null> {
  const { run, worker } = ctx.state;
  if (!findRun(ctx.runs, run)?.workers.length) {
    replace(ctx.root, notice(`Run ${run} has no trace files yet: ${nothing}.`));
    return null;
  }
  const steps = await fetchInto(ctx, `the steps of ${run}`, () => ctx.api.steps(run, worker));
  if (!steps) return null;
  if (!steps.steps.length) {
    replace(ctx.root, noSteps(findRun(ctx.runs, run), steps.worker));
    return null;
  }
  return steps;
}

export function deviceLabel(device: Device): string {
  return device === 'gpu' ? 'GPU' : 'CPU';
}

/** The figure of a phase on the chosen device. */
export function onDevice(times: { host_ms: number; gpu_ms: number }, device: Device): number {
  return device === 'gpu' ? times.gpu_ms : times.host_ms;
}
