/**
 * Time the training hook keeps out of the steps: evaluation passes (`eval`), `prof.paused()` blocks
 * (`paused`) and the profiler's own time (`profiler`). No view stacks it into a step: it is drawn
 * apart, in colours of its own that no phase takes, and always named as outside the steps.
 */

import { el } from './dom';
import { chartColours } from './theme';

export type Apart = 'eval' | 'paused' | 'profiler';

const LABELS: Record<Apart, string> = {
  eval: 'evaluation (outside the steps)',
  paused: 'paused (outside the steps)',
  profiler: 'profiler’s own time (outside the steps)',
};

/** A kind as the API names it (`ApartBand`, a trace event's `args.apart`). */
export function asApart(kind: unknown): Apart | null {
  return kind === 'eval' || kind === 'paused' || kind === 'profiler' ? kind : null;
}

/** How every view names it. */
export function apartLabel(kind: Apart): string {
  return LABELS[kind];
}

export function apartColour(kind: Apart): string {
  const c = chartColours();
  return kind === 'eval' ? c.evaluation : kind === 'paused' ? c.paused : c.profiler;
}

/** Its mark: round, where a phase's is square. */
export function apartMark(kind: Apart): HTMLElement {
  const mark = el('span', { class: 'swatch apart' });
  mark.style.background = apartColour(kind);
  return mark;
}

/** Its name with its mark, as a legend entry. */
export function apartName(kind: Apart): HTMLElement {
  return el('span', { class: 'phase apart', 'data-apart': kind }, apartMark(kind), apartLabel(kind));
}

/** The kinds a step row (or the sum of rows) holds, with their host and GPU ms. */
export function apartOf(row: { eval_ms: number; eval_gpu_ms: number; paused_ms: number; paused_gpu_ms: number }):
  { kind: Apart; ms: number; gpuMs: number }[] {
  const out: { kind: Apart; ms: number; gpuMs: number }[] = [];
  if (row.eval_ms || row.eval_gpu_ms) out.push({ kind: 'eval', ms: row.eval_ms, gpuMs: row.eval_gpu_ms });
  if (row.paused_ms || row.paused_gpu_ms) out.push({ kind: 'paused', ms: row.paused_ms, gpuMs: row.paused_gpu_ms });
  return out;
}
