/** One step in full: its phases, a swimlane timeline, memory per phase, and the ops of each phase. */

import { mountChart } from '../charts/echarts';
import { drawSwimlanes, LANE_HEIGHT } from '../charts/swimlane';
import { select } from '../components/controls';
import { badge, button, card, chartBox, figure, figures, legend, phaseName } from '../components/layout';
import { notice } from '../components/status';
import { opsTable } from '../components/ops_table';
import { table } from '../components/table';
import { el, replace } from '../dom';
import { bytes, ms, pct } from '../format';
import type { StepDetail, StepsAnswer } from '../types';
import { fetchInto, findRun, noSteps, type View, type ViewContext } from './view';

const OPS_SHOWN = 10;

export const step: View = {
  keys: ['run', 'worker', 'step'],
  async render(ctx) {
    const { run, worker } = ctx.state;
    if (!findRun(ctx.runs, run)?.workers.length) {
      replace(ctx.root, notice(`Run ${run} has no trace files yet: no step to open.`));
      return;
    }
    const steps = await fetchInto(ctx, `the steps of ${run}`, () => ctx.api.steps(run, worker));
    if (!steps) return;
    if (!steps.steps.length) {
      replace(ctx.root, noSteps(findRun(ctx.runs, run), steps.worker));
      return;
    }
    const number = ctx.state.step;
    if (number === null) {
      // None chosen: open the slowest step (the new selection draws the view again).
      ctx.go({ step: steps.summary.slowest?.step ?? steps.steps[0].step });
      return;
    }
    const nav = navigation(ctx, steps, number);
    const body = el('div', { class: 'view' });
    replace(ctx.root, nav, body);
    const detail = await fetchInto(ctx, `step ${number} of ${run}`, () => ctx.api.step(run, steps.worker, number), body);
    if (!detail) return;
    replace(body, headline(detail), phasesCard(detail), lanesCard(ctx, detail), memoryCard(detail), opsCard(detail));
  },
};

function navigation(ctx: ViewContext, steps: StepsAnswer, number: number): HTMLElement {
  const numbers = steps.steps.map((s) => s.step);
  const at = numbers.indexOf(number);
  const goTo = (n: number | undefined) => n !== undefined && ctx.go({ step: n });
  const current = steps.steps[at];
  return el(
    'div',
    { class: 'step-nav' },
    button('‹ Previous', () => goTo(numbers[at < 0 ? numbers.length - 1 : at - 1])),
    select(
      'Step',
      steps.steps.map((s) => ({ value: String(s.step), label: `${s.step}${s.empty ? ' (empty)' : ''}` })),
      String(number),
      (v) => goTo(Number(v)),
    ),
    button('Next ›', () => goTo(numbers[at + 1])),
    current?.empty ? badge('empty', 'muted', 'The loop ended inside the profiled window') : null,
    current?.inferred_step ? badge('inferred step', 'muted', "The trace marks no steps: cut from the loop's repeated marks") : null,
    current?.inferred_phases.length
      ? badge(`inferred: ${current.inferred_phases.join(', ')}`, 'muted', 'Phase boundaries inferred from the ops')
      : null,
  );
}

function headline(d: StepDetail): HTMLElement {
  return figures(
    figure('Step', String(d.step)),
    figure('Wall', `${ms(d.wall_ms)} ms`),
    ...(d.gpu_idle_ms !== null
      ? [figure('GPU', `${ms(d.gpu_ms)} ms`, 'Device time of the work the step launched'), figure('GPU idle', `${ms(d.gpu_idle_ms)} ms`)]
      : []),
    figure('Worker', d.worker),
    figure('Span', el('span', { class: 'file', title: d.span }, d.span)),
    d.gpu_names.length ? figure('GPU model', d.gpu_names[0]) : null,
  );
}

function phasesCard(d: StepDetail): HTMLElement {
  const gpu = d.gpu_idle_ms !== null;
  const rows = Object.entries(d.phases).map(([phase, t]) => ({ phase, ...t }));
  type Row = (typeof rows)[number];
  const gpuColumns = gpu
    ? [
        { label: 'GPU ms', value: (r: Row) => r.gpu_ms, cell: (r: Row) => ms(r.gpu_ms), numeric: true },
        { label: 'GPU idle ms', value: (r: Row) => r.gpu_idle_ms, cell: (r: Row) => ms(r.gpu_idle_ms), numeric: true },
        { label: 'Launches', value: (r: Row) => r.launches, numeric: true },
        { label: 'Verdict', value: (r: Row) => r.verdict ?? '' },
      ]
    : [];
  return card(
    `Phases of step ${d.step}`,
    table({
      label: 'Phases of the step',
      rows,
      columns: [
        {
          label: 'Phase',
          value: (r) => r.phase,
          cell: (r) => el('span', null, phaseName(r.phase), r.inferred ? badge('inferred', 'muted', 'Boundaries inferred from the ops') : null),
        },
        { label: 'CPU ms', value: (r) => r.cpu_ms, cell: (r) => ms(r.cpu_ms), numeric: true },
        { label: 'Share', value: (r) => r.cpu_ms, cell: (r) => pct(d.wall_ms ? r.cpu_ms / d.wall_ms : null), numeric: true },
        ...gpuColumns,
      ],
    }),
  );
}

function lanesCard(ctx: ViewContext, d: StepDetail): HTMLElement {
  if (!d.lanes.bands.length) return card('Timeline of the step', el('p', { class: 'empty' }, 'No activity recorded in this step.'));
  const box = chartBox(d.lanes.labels.length * LANE_HEIGHT + 72);
  const out = card(
    'Timeline of the step',
    legend(Object.keys(d.phases)),
    box,
    el('p', { class: 'hint' }, 'Host threads with their phases, then GPU streams coloured by the phase that launched the work. Scroll to zoom.'),
  );
  drawSwimlanes(mountChart(box, ctx.scope), { labels: d.lanes.labels, bands: d.lanes.bands, wallMs: d.wall_ms });
  return out;
}

function memoryCard(d: StepDetail): HTMLElement {
  const rows = Object.entries(d.memory).flatMap(([phase, devices]) =>
    Object.entries(devices).map(([device, m]) => ({ phase, device, ...m })),
  );
  return card(
    'Memory by phase',
    table({
      label: 'Memory by phase',
      rows,
      empty: 'No memory events in this step (profile with profile_memory=True to see them).',
      columns: [
        { label: 'Phase', value: (r) => r.phase, cell: (r) => phaseName(r.phase) },
        { label: 'Device', value: (r) => r.device },
        { label: 'Peak allocated', value: (r) => r.peak_bytes, cell: (r) => bytes(r.peak_bytes), numeric: true },
        { label: 'Net allocated', value: (r) => r.delta_bytes, cell: (r) => bytes(r.delta_bytes, true), numeric: true },
      ],
    }),
  );
}

function opsCard(d: StepDetail): HTMLElement {
  const gpu = d.gpu_idle_ms !== null;
  const sections = Object.entries(d.ops)
    .filter(([, ops]) => ops.length)
    .map(([phase, ops]) =>
      el(
        'div',
        { class: 'ops-phase' },
        el('h4', null, phaseName(phase), el('span', { class: 'muted' }, ` ${ops.length} ops · ${ms(d.phases[phase].cpu_ms)} ms`)),
        opsTable(ops, { gpu, limit: OPS_SHOWN, shapes: true }),
      ),
    );
  return card('Ops by phase', ...(sections.length ? sections : [el('p', { class: 'empty' }, 'No ops recorded in this step.')]));
}
