/**
 * One step's memory in detail: per device, memory by op (allocated, freed and peak delta, self and
 * total) and every allocation and free with its op, address and the bytes allocated after it; the op
 * at the step's peak called out. Opened from the memory curve of the Step view. Without a step
 * (the toolbar's Memory), memory by op over every profiled step the summary keeps, the warm-up,
 * compiling and cut steps left out and named.
 */

import { select } from '../components/controls';
import { card } from '../components/layout';
import { notice } from '../components/status';
import { opName } from '../components/ops_table';
import { table, type Column } from '../components/table';
import { el, replace } from '../dom';
import { bytes, ms, thousands } from '../format';
import type { MemoryDevice, MemoryEventRow, MemoryEventsAnswer, MemoryOpRow } from '../types';
import { fetchInto, overSteps, type View, type ViewContext } from './view';

export const memoryEvents: View = overSteps({
  keys: ['run', 'worker', 'step'],
  nothing: 'no memory to show',
  async render(ctx, steps) {
    const { run } = ctx.state;
    const numbers = steps.steps.map((s) => s.step);
    // no step (or one this worker lacks): the whole run
    const chosen = ctx.state.step;
    const number = chosen !== null && numbers.includes(chosen) ? chosen : null;
    const scope = number === null ? 'every profiled step' : `step ${number}`;
    const body = el('div');
    replace(ctx.root, el('div', { class: 'step-nav' }, stepSelect(ctx, numbers, number)), body);
    const answer = await fetchInto(ctx, `the memory events of ${scope}`,
      () => ctx.api.memoryEvents(run, steps.worker, number), body);
    if (!answer) return;
    const apart = leftOutNote(answer);
    if (!answer.devices.length) {
      replace(body, apart, notice(`No memory event in ${scope}. Profile with `,
        el('code', null, 'profile_memory=True'), ' to see them.'));
      return;
    }
    const label = number === null ? stepCount(answer) : scope;
    const cards = answer.devices.flatMap((d) =>
      [opsCard(d, label), number === null ? null : eventsCard(d, label)]);
    replace(body, apart, ...cards);
  },
});

function stepSelect(ctx: ViewContext, numbers: number[], number: number | null): HTMLElement {
  const options = [{ value: '', label: 'all profiled steps' },
    ...numbers.map((n) => ({ value: String(n), label: `step ${n}` }))];
  return select('Steps', options, number === null ? '' : String(number), (value) =>
    ctx.go({ step: value === '' ? null : Number(value) }, { replace: true }),
  );
}

/** The steps the whole-run tables leave out (warm-up, compiling, cut), and why, in a line. */
function leftOutNote(answer: MemoryEventsAnswer): HTMLElement | null {
  if (answer.step !== null) return null;
  const out = answer.left_out ?? [];
  const why = answer.left_out_why ? ` (${answer.left_out_why})` : '';
  const n = out.length;
  return el('p', { class: 'hint left-out' },
    `Summed over ${stepCount(answer)}; each peak is the highest step's. `,
    n ? `Left out: step${n > 1 ? 's' : ''} ${out.join(', ')}${why}.` : 'No step left out.');
}

function stepCount(answer: MemoryEventsAnswer): string {
  const n = answer.steps ?? 1;
  return `${thousands(n)} profiled step${n === 1 ? '' : 's'}`;
}

function opsCard(d: MemoryDevice, scope: string): HTMLElement {
  const columns: Column<MemoryOpRow>[] = [
    { label: 'Op', value: (r) => r.op, cell: (r) => opName(r.op) },
    { label: 'Events', value: (r) => r.events, cell: (r) => thousands(r.events), numeric: true, title: 'Its own allocations and frees' },
    { label: 'Allocated (self)', value: (r) => r.allocated_self, cell: (r) => bytes(r.allocated_self), numeric: true },
    { label: 'Freed (self)', value: (r) => r.freed_self, cell: (r) => bytes(r.freed_self), numeric: true },
    { label: 'Peak Δ (self)', value: (r) => r.peak_self, cell: (r) => bytes(r.peak_self), numeric: true, title: 'The most its own events raised memory (its largest call)' },
    { label: 'Allocated (total)', value: (r) => r.allocated_total, cell: (r) => bytes(r.allocated_total), numeric: true, title: 'With the ops it called' },
    { label: 'Freed (total)', value: (r) => r.freed_total, cell: (r) => bytes(r.freed_total), numeric: true },
    { label: 'Peak Δ (total)', value: (r) => r.peak_total, cell: (r) => bytes(r.peak_total), numeric: true, title: 'The most it raised memory, with the ops it called' },
  ];
  const at = d.peak_ms === null ? ' (the highest step’s)' : ` at ${ms(d.peak_ms)} ms`;
  const peak = d.peak_op === null ? null
    : el('p', { class: 'hint peak-op' }, `Peak ${bytes(d.peak_bytes)}${at}, in `,
      el('strong', null, d.peak_op), '.');
  return card(`Memory by op on ${d.device}, ${scope}`, peak,
    table<MemoryOpRow>({ label: `Memory by op ${d.device}`, rows: d.ops, columns, sortBy: 7, descending: true, limit: 30 }));
}

function eventsCard(d: MemoryDevice, scope: string): HTMLElement {
  const columns: Column<MemoryEventRow>[] = [
    { label: 'Time ms', value: (e) => e.t_ms, cell: (e) => ms(e.t_ms), numeric: true, title: 'From the step’s start' },
    { label: 'Bytes', value: (e) => e.bytes, cell: (e) => bytes(e.bytes, true), numeric: true, title: '+ allocated, - freed' },
    { label: 'Address', value: (e) => e.addr, cell: (e) => (e.addr === null ? '–' : `0x${e.addr.toString(16)}`), csv: (e) => e.addr },
    { label: 'Op', value: (e) => e.op, cell: (e) => opName(e.op) },
    { label: 'Allocated after', value: (e) => e.allocated, cell: (e) => bytes(e.allocated), numeric: true },
  ];
  const atPeak = (e: MemoryEventRow) => e.t_ms === d.peak_ms && e.allocated === d.peak_bytes;
  return card(
    `Memory events on ${d.device}, ${scope}`,
    d.left_out ? el('p', { class: 'hint' }, `${thousands(d.left_out)} smaller events not listed (the per-op table counts them).`) : null,
    table<MemoryEventRow>({ label: `Memory events ${d.device}`, rows: d.events, columns, sortBy: 0, descending: false, limit: 100, rowClass: (e) => (atPeak(e) ? 'peak' : '') }),
  );
}
