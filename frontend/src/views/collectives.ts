/**
 * The collectives of a run: per worker (rank) each kind, group and message size with its calls, time
 * and nccl-tests' algorithm and bus bandwidth; each rank's compute / communication / overlap / other
 * time per step and phase; and, with several ranks, the rank the others wait for. Over one step or
 * every profiled step; opened from the Ranks view.
 */

import { select } from '../components/controls';
import { card } from '../components/layout';
import { notice } from '../components/status';
import { table, type Column } from '../components/table';
import { el, replace } from '../dom';
import { bytes, ms, thousands } from '../format';
import type { BreakdownStep, CollectiveRow, CollectiveWait, CollectivesAnswer, GpuBreakdown, WaitedFor } from '../types';
import { fetchInto, findRun, type View, type ViewContext } from './view';

export const collectives: View = {
  keys: ['run', 'step'],
  async render(ctx) {
    const { run, step } = ctx.state;
    if (!findRun(ctx.runs, run)?.workers.length) {
      replace(ctx.root, notice(`Run ${run} has no trace files yet: no collectives to list.`));
      return;
    }
    const answer = await fetchInto(ctx, `the collectives of ${run}`, () => ctx.api.collectives(run, step));
    if (!answer) return;
    const numbers = [...new Set(answer.ranks.flatMap((r) => r.steps.map((s) => s.step)))].sort((a, b) => a - b);
    replace(
      ctx.root,
      el('div', { class: 'step-nav' }, stepSelect(ctx, answer, numbers)),
      collectiveCard(answer),
      breakdownCard(answer),
      answer.matched_by === 'none' ? null : waitsCard(answer),
    );
  },
};

function stepSelect(ctx: ViewContext, answer: CollectivesAnswer, numbers: number[]): HTMLElement {
  const choices = [{ value: '', label: 'every profiled step' }, ...numbers.map((n) => ({ value: String(n), label: `step ${n}` }))];
  return select('Steps', choices, answer.step === null ? '' : String(answer.step), (value) =>
    ctx.go({ step: value === '' ? null : Number(value) }, { replace: true }),
  );
}

function rankLabel(worker: string, rank: number | null): string {
  return rank === null ? worker : `${worker} (rank ${rank})`;
}

function gbps(value: number | null): string {
  return value === null ? '–' : value.toFixed(2);
}

function collectiveCard(answer: CollectivesAnswer): HTMLElement {
  const columns: Column<CollectiveRow>[] = [
    { label: 'Worker', value: (r) => rankLabel(r.worker, r.rank) },
    { label: 'Kind', value: (r) => r.kind },
    { label: 'Group', value: (r) => r.group, title: 'The process group (its name or id)' },
    { label: 'Ranks', value: (r) => r.group_size, numeric: true, title: 'Ranks in the group' },
    { label: 'Message', value: (r) => r.bytes, cell: (r) => bytes(r.bytes), numeric: true, title: 'nccl-tests’ size: the larger of input and output' },
    { label: 'Calls', value: (r) => r.calls, cell: (r) => thousands(r.calls), numeric: true },
    { label: 'Time ms', value: (r) => r.time_ms, cell: (r) => ms(r.time_ms), numeric: true, title: 'Per call: its device work, first start to last end (waiting for the other ranks included); else its host range' },
    { label: 'Mean ms', value: (r) => r.mean_ms, cell: (r) => ms(r.mean_ms), numeric: true },
    { label: 'Max ms', value: (r) => r.max_ms, cell: (r) => ms(r.max_ms), numeric: true },
    { label: 'Kernel ms', value: (r) => r.kernel_ms, cell: (r) => ms(r.kernel_ms), numeric: true, title: 'Device time of its work, summed over streams' },
    { label: 'Timed on', value: (r) => (r.on_gpu ? 'GPU' : 'host') },
    { label: 'algbw GB/s', value: (r) => r.algbw_gbps, cell: (r) => gbps(r.algbw_gbps), numeric: true, title: 'Message size over time' },
    { label: 'busbw GB/s', value: (r) => r.busbw_gbps, cell: (r) => gbps(r.busbw_gbps), numeric: true, title: 'algbw × nccl-tests’ factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send/recv 1' },
  ];
  const title = `Collectives${answer.step === null ? ' over the profiled steps' : ` of step ${answer.step}`}`;
  return card(title, table<CollectiveRow>({ label: 'Collectives', rows: answer.collectives, columns, sortBy: 6, descending: true, limit: 50, empty: 'No collective in these steps.' }));
}

interface BreakdownRow extends GpuBreakdown {
  worker: string;
  rank: number | null;
  step: number;
  phase: string;
}

function breakdownCard(answer: CollectivesAnswer): HTMLElement {
  const rows: BreakdownRow[] = [];
  for (const r of answer.ranks) {
    r.steps.forEach((s: BreakdownStep) => {
      rows.push({ worker: r.worker, rank: r.rank, step: s.step, phase: 'whole step', ...s.total });
      for (const [phase, b] of Object.entries(s.phases)) rows.push({ worker: r.worker, rank: r.rank, step: s.step, phase, ...b });
    });
  }
  const gpu = answer.ranks.every((r) => r.measure === 'gpu');
  const columns: Column<BreakdownRow>[] = [
    { label: 'Worker', value: (r) => rankLabel(r.worker, r.rank) },
    { label: 'Step', value: (r) => r.step, numeric: true },
    { label: 'Phase', value: (r) => r.phase },
    { label: 'Compute ms', value: (r) => r.compute_ms, cell: (r) => ms(r.compute_ms), numeric: true },
    { label: 'Communication ms', value: (r) => r.comm_ms, cell: (r) => ms(r.comm_ms), numeric: true },
    { label: 'Overlap ms', value: (r) => r.overlap_ms, cell: (r) => ms(r.overlap_ms), numeric: true, title: 'Communication while compute ran' },
    { label: 'Other ms', value: (r) => r.other_ms, cell: (r) => ms(r.other_ms), numeric: true, title: 'Host time with no device work running (GPU idle)' },
  ];
  return card(
    `Each rank’s time: compute, communication, overlap, other (${gpu ? 'GPU time' : 'host time'})`,
    table<BreakdownRow>({ label: 'Rank time', rows, columns, limit: 40, empty: 'No step.' }),
  );
}

function waitsCard(answer: CollectivesAnswer): HTMLElement {
  const waited: Column<WaitedFor>[] = [
    { label: 'Worker', value: (r) => rankLabel(r.worker, r.rank) },
    { label: 'Matched', value: (r) => r.matched, numeric: true, title: 'Collectives matched across ranks' },
    { label: 'Last to arrive', value: (r) => r.last, numeric: true, title: 'Of those, how many it arrived last at' },
    { label: 'Others waited ms', value: (r) => r.caused_ms, cell: (r) => ms(r.caused_ms), numeric: true, title: 'The other ranks’ waiting for it, summed' },
  ];
  const waits: Column<CollectiveWait>[] = [
    { label: 'Step', value: (w) => w.step, numeric: true },
    { label: 'Kind', value: (w) => w.kind },
    { label: 'Group', value: (w) => w.group },
    { label: 'Position', value: (w) => w.position, numeric: true, title: answer.matched_by === 'seq' ? 'Sequence number in the group' : 'Place among the step’s calls of the group' },
    { label: 'Last rank', value: (w) => rankLabel(w.last_worker, w.last_rank) },
    { label: 'Spread ms', value: (w) => w.spread_ms, cell: (w) => ms(w.spread_ms), numeric: true, title: 'First to last arrival' },
  ];
  const top = [...answer.waited_for].sort((a, b) => b.caused_ms - a.caused_ms)[0];
  return card(
    'Who the others wait for',
    el('p', { class: 'hint' }, answer.note, top && top.last ? `; most waited for: ${rankLabel(top.worker, top.rank)}` : ''),
    table<WaitedFor>({ label: 'Waited for', rows: answer.waited_for, columns: waited, sortBy: 3, descending: true }),
    table<CollectiveWait>({ label: 'Longest waits', rows: answer.waits, columns: waits, sortBy: 5, descending: true, limit: 20 }),
  );
}
