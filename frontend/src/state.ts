/** What the user has selected: the view, the run, worker and step, the sides of a comparison. */

import type { Device } from './types';
import type { UrlHash } from './url_hash';

export type View = 'overview' | 'timeline' | 'step' | 'operators' | 'modules' | 'compare' | 'ranks' | 'collectives' | 'memory';

export const VIEWS: { view: View; label: string }[] = [
  { view: 'overview', label: 'Overview' },
  { view: 'timeline', label: 'Timeline' },
  { view: 'step', label: 'Step' },
  { view: 'operators', label: 'Operators' },
  { view: 'modules', label: 'Modules' },
  { view: 'compare', label: 'Compare' },
  { view: 'ranks', label: 'Ranks' },
  { view: 'collectives', label: 'Collectives' },
  { view: 'memory', label: 'Memory' },
];

/** One side of a comparison; `step` null means the mean of all steps of the worker. */
export interface Side {
  run: string;
  worker: string;
  step: number | null;
}

export interface State {
  view: View;
  run: string;
  worker: string;
  device: Device;
  step: number | null;
  a: Side;
  b: Side;
  /** The steps brushed on the timeline. */
  from: number | null;
  to: number | null;
  /** The op looked for (Operators' search; the row Compare shows first). */
  op: string;
  /** Operators: one row per op name, or per op name and input shapes. */
  group: OpGroup;
  /** Operators: the ops of one phase ('' for all). */
  phase: string;
}

export type OpGroup = 'name' | 'shapes';

function int(value: string | undefined): number | null {
  if (value === undefined || !/^-?\d+$/.test(value)) return null;
  return Number(value);
}

export function decode(v: Record<string, string>): State {
  const view = VIEWS.some((x) => x.view === v.view) ? (v.view as View) : 'overview';
  return {
    view,
    run: v.run ?? '',
    worker: v.worker ?? '',
    device: v.device === 'gpu' ? 'gpu' : 'cpu',
    step: int(v.step),
    a: { run: v.a_run ?? '', worker: v.a_worker ?? '', step: int(v.a_step) },
    b: { run: v.b_run ?? '', worker: v.b_worker ?? '', step: int(v.b_step) },
    from: int(v.from),
    to: int(v.to),
    op: v.op ?? '',
    group: v.group === 'shapes' ? 'shapes' : 'name',
    phase: v.phase ?? '',
  };
}

export function encode(s: State): Record<string, string> {
  const text = (n: number | null) => (n === null ? '' : String(n));
  return {
    view: s.view,
    run: s.run,
    worker: s.worker,
    device: s.device === 'gpu' ? 'gpu' : '',
    step: text(s.step),
    a_run: s.a.run,
    a_worker: s.a.worker,
    a_step: text(s.a.step),
    b_run: s.b.run,
    b_worker: s.b.worker,
    b_step: text(s.b.step),
    from: text(s.from),
    to: text(s.to),
    op: s.op,
    group: s.group === 'shapes' ? 'shapes' : '',
    phase: s.phase,
  };
}

export interface Navigation {
  /** Change the current history entry instead of adding one (defaults, corrections). */
  replace?: boolean;
}

type Listener = (state: State, previous: State) => void;

/**
 * The selections, kept in the URL hash; listeners hear every change, ours or the user's. Opening
 * another view or step adds a history entry, so Back returns to what was shown before.
 */
export class Store {
  private current: State;
  private listeners: Listener[] = [];

  constructor(private readonly hash: UrlHash) {
    this.current = decode(hash.read());
    hash.onChange(() => this.replace(decode(hash.read())));
  }

  get state(): State {
    return this.current;
  }

  set(patch: Partial<State>, navigation: Navigation = {}): void {
    const next = { ...this.current, ...patch };
    const moved = next.view !== this.current.view || next.step !== this.current.step;
    this.hash.write(encode(next), moved && !navigation.replace);
    this.replace(next);
  }

  subscribe(listener: Listener): void {
    this.listeners.push(listener);
  }

  private replace(next: State): void {
    const previous = this.current;
    if (JSON.stringify(previous) === JSON.stringify(next)) return;
    this.current = next;
    for (const listener of this.listeners) listener(next, previous);
  }
}
