/**
 * Every step of a run from the per-step scalars (not only the profiled ones): phases stacked,
 * zoomable, a brushed range summarised; the profiled windows are shaded and open in the overview.
 * Evaluation passes and the profiler's own time, outside every step, are drawn apart beneath. The
 * hook's own time (`phaseprof/hook_ms`), in the steps' windows but in no phase and not in a step's
 * time, is a figure, a line of each step's tooltip and of a selection's note.
 */

import { mountChart, type Chart } from '../charts/echarts';
import { drawTimeline, showRange, timelineHeight, zoomTo, type StepRange } from '../charts/timeline_chart';
import { tooltipBody, type TooltipRow } from '../charts/tooltip';
import { ApiError } from '../api';
import { captureCard } from '../components/capture';
import { button, card, chartBox, figure, figures, legend, phaseName } from '../components/layout';
import { notice } from '../components/status';
import { table } from '../components/table';
import { el, replace } from '../dom';
import { ms, pct, thousands } from '../format';
import { apartLabel, apartName } from '../apart';
import type { Device, Series, TimelineAnswer } from '../types';
import { deviceLabel, findRun, fetchInto, type View, type ViewContext } from './view';

const MISSING = 'missing' as const;

/** What the hook's own time is, wherever the tab shows it. */
const HOOK_LABEL = 'phaseprof’s hooks (in no phase)';
const HOOK_MEANS =
  'phaseprof’s own time in the steps (phaseprof/hook_ms): its bookkeeping at each phase boundary, the trace ranges of '
  + 'profiled steps and the CUDA marks. It is in no phase and not in a step’s time, so the phases equal what your own '
  + 'timers around them measure.';

/** User Timing entries (devtools, benchmarks/timeline_render.py): data in hand, and chart drawn. */
const DATA_MARK = 'phaseprof:timeline-data';
const DRAW_MEASURE = 'phaseprof:timeline-draw';

export const timeline: View = {
  keys: ['run', 'device'],
  async render(ctx) {
    const { run } = ctx.state;
    if (findRun(ctx.runs, run)?.has_scalars === false) {
      replace(ctx.root, noScalars(run));
      return;
    }
    // 404: the run has traces but no scalars (yet).
    const data = await fetchInto(ctx, `the timeline of ${run}`, () =>
      ctx.api.timeline(run).catch((error) => {
        if (error instanceof ApiError && error.status === 404) return MISSING;
        throw error;
      }),
    );
    if (!data) return;
    if (data === MISSING) {
      replace(ctx.root, noScalars(run));
      return;
    }
    const device: Device = ctx.state.device === 'gpu' && hasValues(data.gpu) ? 'gpu' : 'cpu';
    render(ctx, data, device);
  },
};

function noScalars(run: string): HTMLElement {
  return notice(
    el('strong', null, `No per-step timings for ${run} yet. `),
    'PhaseProfiler writes every step’s phase times as TensorBoard scalars (phaseprof/<phase>_ms) as the run goes; ',
    'runs profiled without it have only their traced steps, shown in the Overview.',
  );
}

function hasValues(series: Record<string, Series>): boolean {
  return Object.values(series).some((values) => values.some((v) => v !== null));
}

/** The time outside the steps this run recorded any of, to draw apart. */
function apartSeries(data: TimelineAnswer) {
  const all = [
    { kind: 'eval' as const, values: data.eval },
    { kind: 'profiler' as const, values: data.profiler },
  ];
  return all.filter(({ values }) => values.some((v) => v !== null && v > 0));
}

function sum(values: Series, start = 0, end = values.length): { total: number; count: number } {
  let total = 0;
  let count = 0;
  for (let i = start; i < end; i++) {
    const v = values[i];
    if (v !== null && v > 0) {
      total += v;
      count += 1;
    }
  }
  return { total, count };
}

function render(ctx: ViewContext, data: TimelineAnswer, device: Device): void {
  performance.mark(DATA_MARK);
  const values = device === 'gpu' ? data.gpu : data.cpu;
  const phases = data.phases.filter((p) => values[p]);
  const apart = apartSeries(data);
  const box = chartBox(timelineHeight(apart.length > 0));
  const selection = el('div');
  const n = data.steps.length;
  const evaluation = sum(data.eval);
  const hook = sum(data.hook ?? []);
  replace(
    ctx.root,
    figures(
      figure('Steps recorded', thousands(n)),
      figure('From step', n ? String(data.steps[0]) : '–'),
      figure('To step', n ? String(data.steps[n - 1]) : '–'),
      figure('Mean step', `${ms(mean(totals(data, phases, values, 0, n)))} ms`, `Mean ${deviceLabel(device)} time per step`),
      figure('Profiled windows', String(data.profiled.length)),
      evaluation.count
        ? figure('Evaluation', `${ms(evaluation.total)} ms`,
          `${thousands(evaluation.count)} evaluation pass(es), outside the steps: in no step’s time (phaseprof/eval_ms)`)
        : null,
      hook.count
        ? figure('phaseprof’s hooks', `${ms(hook.total)} ms`,
          `${HOOK_MEANS} Over ${thousands(hook.count)} step(s): ${ms(hook.total / hook.count)} ms a step on average.`)
        : null,
    ),
    data.downsampled
      ? notice(
          'TensorBoard kept a sample of this run’s steps, not all of them: start it with ',
          el('code', null, '--samples_per_plugin scalars=0'),
          ' to keep every step.',
        )
      : null,
    device !== ctx.state.device ? notice('No GPU timings for this run: showing host (CPU) time.') : null,
    card(
      `Every step (${deviceLabel(device)} time)`,
      legend(phases),
      apart.length
        ? el('div', { class: 'legend' }, el('span', { class: 'legend-apart' }, 'Beneath, apart from the steps:'),
          ...apart.map(({ kind }) => apartName(kind)))
        : null,
      box,
      el('p', { class: 'hint' }, 'Scroll to zoom, drag to select a range of steps, click a profiled step (shaded) to open it.',
        apart.length ? ' Evaluation passes (at the step they preceded) and the profiler’s own time are in no step: they are drawn beneath, never stacked with the phases.' : ''),
      hook.count ? el('p', { class: 'hint hook-note' }, `${HOOK_MEANS} Each step’s is in its tooltip.`) : null,
    ),
    selection,
    windowsCard(ctx, data),
    captureCard(ctx, data.run),
  );
  const chart = mountChart(box, ctx.scope);
  const measure = () => {
    chart.off('finished', measure);
    performance.measure(DRAW_MEASURE, DATA_MARK);
  };
  chart.on('finished', measure);
  const select = (range: StepRange | null) => {
    ctx.go({ from: range?.[0] ?? null, to: range?.[1] ?? null });
    replace(selection, range ? selectionCard(chart, data, phases, values, range, device, () => select(null)) : null);
    if (!range) showRange(chart, null);
  };
  drawTimeline(chart, {
    steps: data.steps,
    phases,
    values,
    valueName: `ms (${deviceLabel(device)})`,
    apart,
    profiled: data.profiled,
    tooltip: (i) => stepTooltip(data, phases, values, i),
    onSelect: select,
  });
  // A click on a profiled step opens it (a drag selects a range instead).
  chart.getZr().on('click', (event: { offsetX: number; offsetY: number }) => {
    if (!chart.containPixel({ gridIndex: 0 }, [event.offsetX, event.offsetY])) return;
    const [x] = chart.convertFromPixel({ gridIndex: 0 }, [event.offsetX, event.offsetY]) as number[];
    const step = Math.round(x);
    if (isProfiled(data, step) && data.steps.includes(step)) ctx.go({ view: 'step', step });
  });
  const { from, to } = ctx.state;
  if (from !== null && to !== null) {
    showRange(chart, [from, to]);
    replace(selection, selectionCard(chart, data, phases, values, [from, to], device, () => select(null)));
  }
}

function stepTooltip(data: TimelineAnswer, phases: string[], values: Record<string, Series>, i: number): HTMLElement {
  const rows: TooltipRow[] = [...phases].reverse().map((phase) => ({ phase, label: phase, value: `${ms(values[phase][i])} ms` }));
  rows.push({ label: 'step (wall)', value: `${ms(data.wall[i])} ms`, strong: true });
  if (data.eval[i] !== null) rows.push({ apart: 'eval', label: apartLabel('eval'), value: `${ms(data.eval[i])} ms` });
  if (data.profiler[i]) rows.push({ apart: 'profiler', label: apartLabel('profiler'), value: `${ms(data.profiler[i])} ms` });
  const hook = data.hook?.[i];
  if (hook) rows.push({ label: HOOK_LABEL, value: `${ms(hook)} ms` });
  const step = data.steps[i];
  return tooltipBody(`Step ${step}`, rows, isProfiled(data, step) ? 'profiled: click to open this step' : undefined);
}

function isProfiled(data: TimelineAnswer, step: number): boolean {
  return data.profiled.some(([first, last]) => step >= first && step <= last);
}

/** Per-step totals over the indices [start, end): the wall time on the host, the phase sum on the GPU. */
function totals(data: TimelineAnswer, phases: string[], values: Record<string, Series>, start: number, end: number): number[] {
  const out: number[] = [];
  for (let i = start; i < end; i++) {
    let sum: number | null = values === data.cpu ? data.wall[i] : null;
    if (sum === null) {
      for (const phase of phases) {
        const v = values[phase][i];
        if (v !== null) sum = (sum ?? 0) + v;
      }
    }
    if (sum !== null) out.push(sum);
  }
  return out;
}

function mean(xs: (number | null)[]): number | null {
  let sum = 0;
  let n = 0;
  for (const x of xs) {
    if (x !== null) {
      sum += x;
      n += 1;
    }
  }
  return n ? sum / n : null;
}

function selectionCard(
  chart: Chart,
  data: TimelineAnswer,
  phases: string[],
  values: Record<string, Series>,
  range: StepRange,
  device: Device,
  clear: () => void,
): HTMLElement {
  const start = data.steps.findIndex((s) => s >= range[0]);
  let end = data.steps.findIndex((s) => s > range[1]);
  if (end < 0) end = data.steps.length;
  const stepMean = mean(totals(data, phases, values, start, end));
  const rows = phases.map((phase) => {
    const m = mean(values[phase].slice(start, end));
    return { phase, mean: m, share: m !== null && stepMean ? m / stepMean : null };
  });
  const evaluation = sum(data.eval, start, end);
  const profiler = sum(data.profiler, start, end);
  const hook = sum(data.hook ?? [], start, end);
  const apart = [
    evaluation.count ? `${thousands(evaluation.count)} evaluation pass(es), ${ms(evaluation.total)} ms` : '',
    profiler.count ? `the profiler’s own time, ${ms(profiler.total)} ms` : '',
    hook.count ? `phaseprof’s hooks (in no phase), ${ms(hook.total)} ms` : '',
  ].filter(Boolean);
  return card(
    `Selected: steps ${range[0]}–${range[1]}`,
    el('p', null, `${thousands(end - start)} steps recorded, mean step ${ms(stepMean)} ms (${deviceLabel(device)}).`),
    apart.length
      ? el('p', { class: 'apart-note' }, `Outside the steps, not in the figures above: ${apart.join('; ')}.`)
      : null,
    table({
      label: 'Selected steps by phase',
      rows,
      columns: [
        { label: 'Phase', value: (r) => r.phase, cell: (r) => phaseName(r.phase) },
        { label: `Mean ${deviceLabel(device)} ms`, value: (r) => r.mean, cell: (r) => ms(r.mean), numeric: true },
        { label: 'Share', value: (r) => r.share, cell: (r) => pct(r.share), numeric: true },
      ],
    }),
    el('div', { class: 'actions' }, button('Zoom to selection', () => zoomTo(chart, range)), button('Show all steps', () => zoomTo(chart, null)), button('Clear selection', clear)),
  );
}

function windowsCard(ctx: ViewContext, data: TimelineAnswer): HTMLElement {
  if (!data.profiled.length) return card('Profiled windows', el('p', { class: 'empty' }, 'No step of this run was profiled (traced) yet.'));
  return card(
    'Profiled windows',
    el('p', null, data.profiled.map(([first, last]) => (first === last ? `step ${first}` : `steps ${first}–${last}`)).join(', ')),
    button('Open the profiled steps in the Overview', () => ctx.go({ view: 'overview' })),
  );
}
