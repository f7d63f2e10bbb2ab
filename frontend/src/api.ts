/**
 * The plugin's HTTP routes (plugin/http_api.md). URLs resolve against this module's own URL
 * (`/data/plugin/phaseprof/index.js`), so they reach the routes however the page embedding the tab
 * is addressed, and never leave its origin.
 */

import type {
  CollectivesAnswer,
  CompareAnswer,
  KernelsAnswer,
  MemoryAnswer,
  MemoryEventsAnswer,
  ModulesAnswer,
  OpsAnswer,
  RanksAnswer,
  RunsAnswer,
  StepDetail,
  StepsAnswer,
  TimelineAnswer,
} from './types';

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly route: string,
    message: string,
  ) {
    super(message);
  }
}

type Params = Record<string, string | number | null | undefined>;

const BASE = new URL('./', import.meta.url);

export class Api {
  /** Answers by URL: views that share a route (the overview and a step's list) fetch it once. */
  private answers = new Map<string, Promise<unknown>>();
  /** The body of each answer, to tell when the server's answer changed. */
  private bodies = new Map<string, string>();
  /** What the view on screen asked for (URL -> route), the answers `revalidate` checks. */
  private shown = new Map<string, string>();
  /** Answers kept as text rather than parsed. */
  private readonly texts = new Set<string>();

  runs = () => this.get<RunsAnswer>('runs', {}, false);
  steps = (run: string, worker: string) => this.get<StepsAnswer>('steps', { run, worker });
  step = (run: string, worker: string, step: number) => this.get<StepDetail>('step', { run, worker, step });
  timeline = (run: string) => this.get<TimelineAnswer>('timeline', { run });
  ranks = (run: string) => this.get<RanksAnswer>('ranks', { run });
  compare = (params: Params) => this.get<CompareAnswer>('compare', params);
  kernels = (run: string, worker: string, step: number | null, phase = '') =>
    this.get<KernelsAnswer>('kernels', { run, worker, step, phase });
  ops = (run: string, worker: string, group: string, phase = '') => this.get<OpsAnswer>('ops', { run, worker, group, phase });
  memory = (run: string, worker: string, step: number) => this.get<MemoryAnswer>('memory', { run, worker, step });
  /** `step` null: memory by op over every profiled step the summary keeps. */
  memoryEvents = (run: string, worker: string, step: number | null) =>
    this.get<MemoryEventsAnswer>('memory_events', { run, worker, step });
  collectives = (run: string, step: number | null) => this.get<CollectivesAnswer>('collectives', { run, step });
  modules = (run: string, worker: string, step: number | null) => this.get<ModulesAnswer>('modules', { run, worker, step });
  /** A step as Chrome-trace JSON, as text: what "Download" saves is exactly what was drawn. */
  trace = (run: string, worker: string, step: number) => this.get<string>('trace', { run, worker, step }, true, true);

  /** A new view is being drawn: what it asks for from now on is what `revalidate` checks. */
  newView(): void {
    this.shown.clear();
  }

  /**
   * Ask again for what the view on screen shows, and forget every other answer (it may be stale).
   * True if any answer changed, or failed: the view should be drawn again.
   */
  async revalidate(): Promise<boolean> {
    const shown = [...this.shown];
    const fresh = await Promise.all(shown.map(([url, route]) => request(url, route).catch(() => null)));
    const answers = new Map<string, Promise<unknown>>();
    const bodies = new Map<string, string>();
    let changed = false;
    shown.forEach(([url], i) => {
      const body = fresh[i];
      if (body === null) {
        changed = true;
        return;
      }
      changed ||= body !== this.bodies.get(url);
      bodies.set(url, body);
      answers.set(url, Promise.resolve(this.texts.has(url) ? body : JSON.parse(body)));
    });
    this.answers = answers;
    this.bodies = bodies;
    return changed;
  }

  private get<T>(route: string, params: Params, cached = true, text = false): Promise<T> {
    const url = new URL(route, BASE);
    for (const [key, value] of Object.entries(params)) {
      if (value !== null && value !== undefined && value !== '') url.searchParams.set(key, String(value));
    }
    const key = url.toString();
    if (!cached) return request(key, route).then((body) => JSON.parse(body) as T);
    this.shown.set(key, route);
    if (text) this.texts.add(key);
    let answer = this.answers.get(key);
    if (!answer) {
      answer = request(key, route).then((body) => {
        this.bodies.set(key, body);
        return text ? body : JSON.parse(body);
      });
      this.answers.set(key, answer);
      answer.catch(() => this.answers.delete(key)); // a failure is asked again next time
    }
    return answer as Promise<T>;
  }
}

/** The body of a successful answer; an `ApiError` with the server's message otherwise. */
async function request(url: string, route: string): Promise<string> {
  let response: Response;
  try {
    response = await fetch(url, { credentials: 'same-origin' });
  } catch {
    throw new ApiError(0, route, 'TensorBoard did not answer: is it still running?');
  }
  const body = await response.text();
  if (!response.ok) throw new ApiError(response.status, route, body.trim() || `${response.status} ${response.statusText}`);
  return body;
}
