/** Every worker (rank) of a run side by side, its mean step by phase, the straggler called out. */

import { mountChart } from '../charts/echarts';
import { drawStackedBars } from '../charts/stacked_bars';
import { tooltipBody } from '../charts/tooltip';
import { badge, card, chartBox, legend, phaseName } from '../components/layout';
import { notice } from '../components/status';
import { table, type Column } from '../components/table';
import { el, replace } from '../dom';
import { ms, signedMs } from '../format';
import type { Device, RankRow, RanksAnswer, WholeRun } from '../types';
import { fetchInto, findRun, type View, type ViewContext } from './view';

export const ranks: View = {
  keys: ['run', 'device'],
  async render(ctx) {
    const { run } = ctx.state;
    if (!findRun(ctx.runs, run)?.workers.length) {
      replace(ctx.root, notice(`Run ${run} has no trace files yet: no ranks to show.`));
      return;
    }
    const data = await fetchInto(ctx, `the ranks of ${run}`, () => ctx.api.ranks(run));
    if (!data) return;
    if (!data.ranks.length) {
      replace(ctx.root, notice(`No worker of ${run} has a loaded trace yet.`));
      return;
    }
    // One measure for the whole view, the answer's: GPU time when every rank has GPU activity.
    const device: Device = data.measure === 'gpu' ? 'gpu' : 'cpu';
    replace(
      ctx.root,
      worldLine(data),
      stragglerLine(data),
      device !== ctx.state.device
        ? notice(device === 'gpu'
          ? 'Every rank ran work on the GPU: the ranks are compared in GPU time.'
          : 'Not every rank ran work on the GPU: the ranks are compared in host time.')
        : null,
      chartCard(ctx, data, device),
      tableCard(ctx, data, device),
      wholeRunCard(data),
    );
  },
};

/** Which ranks of the job these traces are: the world size the traces record, the ranks whose traces
 *  are not here, and files left out as other files of a worker already listed. */
function worldLine(data: RanksAnswer): HTMLElement | null {
  const ranked = data.ranks.filter((r) => r.rank !== null).map((r) => r.rank as number);
  const parts: (string | HTMLElement)[] = [];
  if (data.world_size !== null) {
    parts.push(
      el('strong', null, `${ranked.length === 1 ? `Rank ${ranked[0]}` : `Ranks ${rankList(ranked) || '–'}`} of world size ${data.world_size}`),
      '. ',
    );
    if (data.missing_ranks.length) {
      const missing = data.missing_ranks;
      parts.push(
        el('strong', null, `No trace of rank${missing.length > 1 ? 's' : ''} ${rankList(missing)}`),
        `: ${missing.length > 1 ? 'they are' : 'it is'} not in this run, so the ranks cannot be compared in full. `,
        'Profile every rank (each writes its own trace) to find a straggler.',
      );
    }
  }
  if (data.not_ranks.length) {
    parts.push(
      ` Left out as other files of a worker already listed (the same rank, or the same steps at the same instants): ${data.not_ranks.join(', ')}.`,
    );
  }
  if (!parts.length) return null;
  return el('div', { class: `status ${data.missing_ranks.length ? 'notice' : 'even'}`, role: 'note' }, el('span', null, ...parts));
}

/** Rank numbers with runs joined: `0, 2–127`. */
export function rankList(numbers: number[]): string {
  const sorted = [...numbers].sort((a, b) => a - b);
  const parts: string[] = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j += 1;
    parts.push(j > i + 1 ? `${sorted[i]}–${sorted[j]}` : sorted.slice(i, j + 1).join(', '));
    i = j + 1;
  }
  return parts.join(', ');
}

function rankName(r: { rank: number | null; worker: string }): string {
  return r.rank === null ? r.worker : `rank ${r.rank}`;
}

function stragglerLine(data: RanksAnswer): HTMLElement {
  const s = data.straggler;
  if (!s) return el('div', { class: 'status even', role: 'note' }, el('strong', null, 'No straggler'), `: ${data.note}.`);
  return el(
    'div',
    { class: 'status straggler', role: 'note' },
    el('strong', null, `Straggler: ${rankName(s)}`),
    ` (${s.worker}): ${s.reason}. It works longest against the median rank in `,
    phaseName(s.phase),
    ` (${signedMs(s.phase_behind_ms)} ms per step, collectives left out).`,
  );
}

function chartCard(ctx: ViewContext, data: RanksAnswer, device: Device): HTMLElement {
  const rows = data.ranks;
  const box = chartBox(Math.max(120, rows.length * 28 + 60));
  const out = card(
    device === 'gpu' ? 'Mean step per rank (GPU compute by phase)' : 'Mean step per rank (CPU time)',
    legend(data.phases),
    box,
    el('p', { class: 'hint' }, 'Click a rank to open its overview.'),
  );
  const straggler = data.straggler?.worker;
  drawStackedBars(mountChart(box, ctx.scope), {
    categories: rows.map(rankName),
    phases: data.phases,
    horizontal: true,
    value: (phase, i) => phaseValue(rows[i], phase, device),
    valueName: device === 'gpu' ? 'ms (GPU compute)' : 'ms (CPU)',
    flagged: (i) => rows[i].worker === straggler,
    tooltip: (i) =>
      tooltipBody(
        `${rankName(rows[i])} · ${rows[i].worker}`,
        [
          ...[...data.phases].reverse().map((phase) => ({ phase, label: phase, value: `${ms(phaseValue(rows[i], phase, device))} ms` })),
          ...(device === 'gpu'
            ? [
                { label: 'GPU compute', value: `${ms(rows[i].compute_ms)} ms` },
                { label: 'communication', value: `${ms(rows[i].comm_ms)} ms` },
                { label: 'exposed communication', value: `${ms(rows[i].exposed_comm_ms)} ms` },
                { label: 'GPU busy', value: `${ms(rows[i].step_ms)} ms`, strong: true },
              ]
            : [{ label: 'step (wall)', value: `${ms(rows[i].wall_ms)} ms`, strong: true }]),
        ],
        rows[i].worker === straggler ? 'the straggler' : undefined,
      ),
    onPick: (i) => ctx.go({ view: 'overview', worker: rows[i].worker }),
  });
  return out;
}

/** A phase's bar on the chart: its host time, or (GPU) its part of the GPU compute time. */
function phaseValue(r: RankRow, phase: string, device: Device): number {
  return device === 'gpu' ? (r.phase_compute_ms[phase] ?? 0) : r.phases[phase].host_ms;
}

/** Every rank's figures, all in one measure (the answer's): host time, or GPU time. */
function tableCard(ctx: ViewContext, data: RanksAnswer, device: Device): HTMLElement {
  const straggler = data.straggler?.worker;
  const gpu = device === 'gpu';
  const figures: Column<RankRow>[] = gpu
    ? [
        { label: 'GPU busy ms', value: (r) => r.step_ms, cell: (r) => ms(r.step_ms), numeric: true, title: 'Mean GPU busy time per step: device activity over all streams, an instant counted once' },
        { label: 'Communication ms', value: (r) => r.comm_ms, cell: (r) => ms(r.comm_ms), numeric: true, title: 'GPU time in collectives (NCCL, …) per step: the ranks that wait longest in them wait for the straggler' },
        { label: 'Exposed comm ms', value: (r) => r.exposed_comm_ms, cell: (r) => ms(r.exposed_comm_ms), numeric: true, title: 'Communication no compute overlapped on any stream' },
        { label: 'Compute ms', value: (r) => r.compute_ms, cell: (r) => ms(r.compute_ms), numeric: true, title: 'GPU busy time of compute (not collectives): what the straggler rule compares across ranks' },
        ...data.phases.map((phase) => ({
          label: `${phase} compute`,
          value: (r: RankRow) => r.phase_compute_ms[phase],
          cell: (r: RankRow) => ms(r.phase_compute_ms[phase]),
          numeric: true,
          title: `GPU compute time of the work ${phase} launched, per step: where the straggler's phase is found`,
        })),
      ]
    : [
        { label: 'Step ms', value: (r) => r.wall_ms, cell: (r) => ms(r.wall_ms), numeric: true },
        {
          label: 'Collectives ms',
          value: (r) => r.comm_ms,
          cell: (r) => ms(r.comm_ms),
          numeric: true,
          title: 'Time per step in collectives (all_reduce, …): the ranks that wait longest in them wait for the straggler',
        },
        {
          label: 'Compute ms',
          value: (r) => r.compute_ms,
          cell: (r) => ms(r.compute_ms),
          numeric: true,
          title: 'The step less its collectives: what the straggler rule compares across ranks',
        },
        ...data.phases.map((phase) => ({
          label: phase,
          value: (r: RankRow) => r.phases[phase].host_ms,
          cell: (r: RankRow) => ms(r.phases[phase].host_ms),
          numeric: true,
        })),
        ...data.phases.map((phase) => ({
          label: `${phase} compute`,
          value: (r: RankRow) => r.phase_compute_ms[phase],
          cell: (r: RankRow) => ms(r.phase_compute_ms[phase]),
          numeric: true,
          title: `Host time of ${phase} less its collectives, per step: where the straggler's phase is found`,
        })),
      ];
  return card(
    `Ranks (${gpu ? 'GPU' : 'host'} ms per step)`,
    el('p', { class: 'hint' }, el('button', { type: 'button', class: 'link', title: 'Each collective’s calls, sizes and bandwidth, each rank’s compute / communication / overlap per step and phase, and the rank the others wait for', onclick: () => ctx.go({ view: 'collectives', step: null }) }, 'Collectives, bandwidth and who waits for whom')),
    table<RankRow>({
      label: 'Ranks',
      rows: data.ranks,
      onRowClick: (r) => ctx.go({ view: 'overview', worker: r.worker }),
      rowClass: (r) => (r.worker === straggler ? 'flagged' : ''),
      columns: [
        { label: 'Rank', value: (r) => r.rank, cell: (r) => (r.rank === null ? '–' : String(r.rank)), numeric: true },
        {
          label: 'Worker',
          value: (r) => r.worker,
          cell: (r) => el('span', null, r.worker, r.worker === straggler ? badge('straggler', 'danger') : null),
        },
        { label: 'Steps', value: (r) => r.steps, numeric: true },
        ...figures,
      ],
    }),
  );
}

/** Every timed step of each rank, from its per-step scalars: the traced window is a few steps, these
 *  are all of them. The highest median of each column is flagged. */
function wholeRunCard(data: RanksAnswer): HTMLElement | null {
  const rows = data.whole_run ?? [];
  if (!rows.length) return null;
  const phases = ['step', ...data.phases].filter((p) => rows.some((r) => median(r, p) !== null));
  const worst = new Map(phases.map((p) => [p, Math.max(...rows.map((r) => median(r, p) ?? -Infinity))]));
  return card(
    'Every step of each rank (per-step scalars, host ms)',
    table<WholeRun>({
      label: 'Ranks over the whole run',
      rows,
      columns: [
        { label: 'Rank', value: (r) => r.rank, cell: (r) => (r.rank === null ? '–' : String(r.rank)), numeric: true },
        { label: 'Steps', value: (r) => r.steps, numeric: true },
        { label: 'Step p90', value: (r) => spread(r, 'step')?.p90_ms ?? null, cell: (r) => ms(spread(r, 'step')?.p90_ms), numeric: true },
        { label: 'Step max', value: (r) => spread(r, 'step')?.max_ms ?? null, cell: (r) => ms(spread(r, 'step')?.max_ms), numeric: true },
        ...phases.map((phase) => ({
          label: `${phase} median`,
          value: (r: WholeRun) => median(r, phase),
          cell: (r: WholeRun) => {
            const v = median(r, phase);
            return rows.length > 1 && v !== null && v === worst.get(phase) ? el('strong', null, ms(v)) : ms(v);
          },
          numeric: true,
        })),
      ],
    }),
    el('p', { class: 'hint' }, 'Median time per step over every timed step of each rank; the highest of each column in bold.'),
  );
}

function spread(r: WholeRun, phase: string) {
  return r.phases.find((p) => p.phase === phase && p.clock === 'host');
}

function median(r: WholeRun, phase: string): number | null {
  return spread(r, phase)?.median_ms ?? null;
}
