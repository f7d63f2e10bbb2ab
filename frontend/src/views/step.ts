/**
 * One step in full: on GPU runs its four GPU measures, critical path, streams and the host calls
 * that waited for the GPU; its phases, a swimlane timeline (the critical path drawn over it), its
 * trace (every op and kernel), memory over the step and per phase, its kernels, and the ops of
 * each phase. Time in the step's window kept out
 * of the step (an evaluation pass, a paused block) is said apart and shown where it lies, in its
 * own colour, never as a phase.
 */

import { mountChart } from '../charts/echarts';
import { drawMemory } from '../charts/memory_chart';
import { drawSwimlanes, LANE_HEIGHT, placePath } from '../charts/swimlane';
import { drawTrace, layoutTrace, type RangeRow } from '../charts/trace_view';
import { select } from '../components/controls';
import { measuresCard, pathCard, streamsCard, syncsCard } from '../components/gpu_time';
import { badge, button, card, chartBox, figure, figures, legend, phaseName } from '../components/layout';
import { failure, loading, notice } from '../components/status';
import { kernelLabels } from '../components/kernel_names';
import { opName, opsTable } from '../components/ops_table';
import { saveFile, table, type Column } from '../components/table';
import { el, replace } from '../dom';
import { bytes, ms, pct, thousands } from '../format';
import { asApart, apartLabel, apartName, apartOf } from '../apart';
import type { KernelRow, MemorySeries, StepDetail, StepTrace, StepsAnswer } from '../types';
import { fetchInto, overSteps, type View, type ViewContext } from './view';

const OPS_SHOWN = 10;
const KERNELS_SHOWN = 15;
/** User Timing marks around drawing the step's trace (benchmarks/step_trace_render.py reads them). */
const TRACE_DATA = 'phaseprof:trace-data';
const TRACE_DRAW = 'phaseprof:trace-draw';

export const step: View = overSteps({
  keys: ['run', 'worker', 'step'],
  nothing: 'no step to open',
  async render(ctx, steps) {
    const { run } = ctx.state;
    const number = ctx.state.step;
    if (number === null) {
      // None chosen: open the slowest step (the new selection draws the view again).
      ctx.go({ step: steps.summary.slowest?.step ?? steps.steps[0].step }, { replace: true });
      return;
    }
    const nav = navigation(ctx, steps, number);
    const body = el('div', { class: 'view' });
    replace(ctx.root, nav, body);
    const detail = await fetchInto(ctx, `step ${number} of ${run}`, () => ctx.api.step(run, steps.worker, number), body);
    if (!detail) return;
    const gpu = detail.gpu_idle_ms !== null;
    replace(
      body,
      headline(detail),
      aheadNote(detail),
      apartNote(detail),
      ...gpuCards(ctx, detail),
      phasesCard(detail),
      lanesCard(ctx, detail),
      traceCard(ctx, detail),
      el('div', { class: 'columns' }, memoryCurveCard(ctx, detail), memoryCard(detail)),
      gpu ? kernelsCard(ctx, detail) : null,
      opsCard(ctx, detail),
    );
  },
});

/** What the GPU did in the step and what bounds it (GPU runs only: nothing on a CPU-only step). */
function gpuCards(ctx: ViewContext, d: StepDetail): HTMLElement[] {
  const g = d.gpu_time;
  if (!g) return [];
  const path = d.critical_path;
  const syncs = syncsCard(d.step, d.blocking, (name) => opLink(ctx, name));
  const streams = streamsCard(g, `GPU streams in step ${d.step}`);
  const measures = measuresCard(g, `GPU time of step ${d.step}`);
  const drawn = el('p', { class: 'hint' }, 'Drawn over the timeline of the step below.');
  return [
    path
      ? el('div', { class: 'columns' }, el('div', { class: 'stack' }, measures, streams),
          pathCard(path, `Critical path of step ${d.step}`, drawn))
      : el('div', { class: 'columns' }, measures, streams),
    syncs,
  ];
}

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
    ...(d.gpu_idle_ms !== null && d.gpu_time
      ? [
          figure('GPU busy', `${ms(d.gpu_time.busy_ms)} ms`, 'Device activity of the work the step launched, over all streams: an instant counted once'),
          figure('Kernel time', `${ms(d.gpu_time.kernel_ms)} ms`, 'Device time of the work the step launched, summed over streams'),
          figure('GPU window', `${ms(d.gpu_time.window_ms)} ms`, 'First to last device activity of the work the step launched'),
          figure('GPU idle in host window', `${ms(d.gpu_idle_ms)} ms`,
            'Time in the step’s host window with no device activity; the GPU time card’s idle is '
            + 'of the GPU window (first to last device activity), which the host’s need not match'),
        ]
      : []),
    figure('Worker', d.worker),
    figure('Span', el('span', { class: 'file', title: d.span }, d.span)),
    d.gpu_names.length ? figure('GPU model', d.gpu_names[0]) : null,
    ...apartOf(d).map(({ kind, ms: host }) =>
      figure(kind === 'eval' ? 'Evaluation (outside)' : 'Paused (outside)', `${ms(host)} ms`, `${apartLabel(kind)}: not in the step's wall time`)),
  );
}

/** When the step's GPU work outlasts its host window (the host ran ahead), in a sentence. */
function aheadNote(d: StepDetail): HTMLElement | null {
  const g = d.gpu_time;
  if (!g || g.past_host_ms <= 0) return null;
  return notice(
    el('strong', null, `The GPU work of step ${d.step} runs ${ms(g.past_host_ms)} ms past its host window. `),
    'The host ran ahead of the GPU: the step’s wall time is the host’s, and its GPU work, drawn below past the step’s end, ',
    `keeps the GPU busy ${ms(g.busy_ms)} ms in a ${ms(g.window_ms)} ms window.`,
  );
}

/** What the step's window held that is not the step's, in a sentence. */
function apartNote(d: StepDetail): HTMLElement | null {
  const held = apartOf(d);
  if (!held.length) return null;
  const parts = held.map(({ kind, ms: host, gpuMs }) =>
    `${kind === 'eval' ? 'an evaluation pass' : 'a prof.paused() block'} (${ms(host)} ms${gpuMs ? `, launching ${ms(gpuMs)} ms of GPU work` : ''})`);
  return notice(
    el('strong', null, `The window of step ${d.step} also held ${parts.join(' and ')}. `),
    'It is kept out of the step, as the training loop’s own timings keep it: not in its wall time, phases, ops, kernels or memory by phase. ',
    'The timeline and the trace below show where it ran.',
  );
}

/** The step's window in ms: the step's own time and what was kept out of it. */
function windowMs(d: StepDetail): number {
  return d.wall_ms + d.eval_ms + d.paused_ms;
}

function phasesCard(d: StepDetail): HTMLElement {
  const gpu = d.gpu_idle_ms !== null;
  const rows = Object.entries(d.phases).map(([phase, t]) => ({ phase, ...t }));
  type Row = (typeof rows)[number];
  const busy = d.gpu_time?.busy_ms ?? 0;
  // a step that communicates (DDP, FSDP…) shows its compute and communication apart, per phase
  const commColumns = (d.gpu_time?.comm_ms ?? 0) > 0
    ? [
        { label: 'Compute ms', value: (r: Row) => r.gpu_compute_ms, cell: (r: Row) => ms(r.gpu_compute_ms), numeric: true, title: 'GPU time with compute running (kernels that are neither communication nor copies)' },
        { label: 'Comm ms', value: (r: Row) => r.comm_ms, cell: (r: Row) => ms(r.comm_ms), numeric: true, title: 'GPU time with the phase’s communication (collectives) running' },
        { label: 'Exposed comm ms', value: (r: Row) => r.exposed_comm_ms, cell: (r: Row) => ms(r.exposed_comm_ms), numeric: true, title: 'Communication with no compute on any stream: what overlap would win back' },
      ]
    : [];
  const gpuColumns = gpu
    ? [
        { label: 'GPU busy ms', value: (r: Row) => r.gpu_busy_ms, cell: (r: Row) => ms(r.gpu_busy_ms), numeric: true, title: 'GPU busy time of the work the phase launched: over all streams, an instant counted once' },
        { label: 'GPU share', value: (r: Row) => r.gpu_busy_ms, cell: (r: Row) => pct(busy ? r.gpu_busy_ms / busy : null), numeric: true, title: 'Share of the step’s GPU busy time' },
        ...commColumns,
        { label: 'Kernel ms', value: (r: Row) => r.gpu_ms, cell: (r: Row) => ms(r.gpu_ms), numeric: true, title: 'Kernel time: device time summed over streams' },
        { label: 'GPU idle ms', value: (r: Row) => r.gpu_idle_ms, cell: (r: Row) => ms(r.gpu_idle_ms), numeric: true, title: 'Host time of the phase with no device activity' },
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
        { label: 'Host ms', value: (r) => r.host_ms, cell: (r) => ms(r.host_ms), numeric: true },
        { label: 'Host share', value: (r) => r.host_ms, cell: (r) => pct(d.wall_ms ? r.host_ms / d.wall_ms : null), numeric: true, title: 'Share of the step’s host (wall) time' },
        ...gpuColumns,
      ],
    }),
  );
}

const LANES_HINT = 'Host threads with their phases, then GPU streams coloured by the phase that '
  + 'launched the work. Each lane is drawn where it was busy: gaps shorter than a pixel may be '
  + 'filled, never more than 0.5% of its busy time. Scroll to zoom.';
const PATH_HINT = ' The line is the step’s critical path, dashed where it moves from lane to lane.';

function lanesCard(ctx: ViewContext, d: StepDetail): HTMLElement {
  if (!d.lanes.bands.length) return card('Timeline of the step', el('p', { class: 'empty' }, 'No activity recorded in this step.'));
  const box = chartBox(d.lanes.labels.length * LANE_HEIGHT + 72);
  const path = d.critical_path?.segments ?? [];
  const legendBox = apartLegend(d);
  if (path.length) {
    const swatch = el('span', { class: 'path-swatch' });
    legendBox.append(el('span', { class: 'legend-path' }, swatch, 'critical path'));
  }
  const out = card(
    'Timeline of the step',
    legendBox,
    box,
    el('p', { class: 'hint' }, LANES_HINT,
      path.length ? PATH_HINT : ''),
  );
  // for the browser tests: how many of the path's stretches are drawn on a lane
  box.dataset.pathDrawn = String(placePath(d.lanes.labels, path).length);
  const { labels, bands } = d.lanes;
  const chart = mountChart(box, ctx.scope);
  drawSwimlanes(chart, { labels, bands, apart: d.apart, wallMs: windowMs(d), path });
  return out;
}

function traceCard(ctx: ViewContext, d: StepDetail): HTMLElement {
  const box = el('div', { class: 'trace-box' }, loading('Cutting the step out of its trace file…'));
  const actions = el('div', { class: 'actions' });
  const panels = {
    tools: el('div', { class: 'table-tools trace-tools' }),
    selection: el('div', { class: 'trace-selection', 'aria-live': 'polite' }),
    range: el('div', { class: 'trace-range' }),
    rangeTable: (rows: RangeRow[]) => rangeTable(ctx, d, rows),
  };
  const out = card(
    'Trace of the step',
    apartLegend(d),
    actions,
    panels.tools,
    box,
    panels.selection,
    el('p', { class: 'hint' }, 'Threads with their ops nested by depth, then GPU streams with the work the step launched, coloured by the phase that launched it. Scroll to zoom, drag to pan, double-click to see the whole step; the red line is the step’s end. Hover or click a launch, a kernel or an op for arrows from each launch to the work it launched; shift-drag to count and time the events of a range.'),
    panels.range,
  );
  void (async () => {
    let text: string;
    try {
      text = await ctx.api.trace(d.run, d.worker, d.step);
    } catch (error) {
      if (ctx.scope.live) replace(box, failure(`the trace of step ${d.step}`, error));
      return;
    }
    if (!ctx.scope.live) return;
    performance.clearMarks(TRACE_DATA);
    performance.clearMeasures(TRACE_DRAW);
    performance.mark(TRACE_DATA);
    const doc = JSON.parse(text) as StepTrace;
    const layout = layoutTrace(doc);
    replace(
      actions,
      el('span', { class: 'muted' }, `${thousands(doc.otherData.host_events)} host events, ${thousands(doc.otherData.device_events)} on the GPU. `),
      button('Download', () => saveFile(`${d.worker}.step${d.step}.pt.trace.json`, text, 'application/json'),
        'Save this step as Chrome-trace JSON (opens in chrome://tracing and Perfetto)'),
    );
    drawTrace(box, layout, ctx.scope, panels);
    performance.measure(TRACE_DRAW, TRACE_DATA);
  })();
  return out;
}

/** The events of a brushed range by name: count, time inside the range and in all; sortable, CSV. */
function rangeTable(ctx: ViewContext, d: StepDetail, rows: RangeRow[]): HTMLElement {
  return table<RangeRow>({
    label: `Events of step ${d.step} in the range`,
    rows,
    sortBy: 3,
    empty: 'No event in this range.',
    columns: [
      { label: 'Name', value: (r) => r.name, cell: (r) => (r.where === 'host' ? opLink(ctx, r.name) : opName(r.name)) },
      { label: 'Where', value: (r) => r.where },
      { label: 'Count', value: (r) => r.count, numeric: true },
      { label: 'In range ms', value: (r) => r.in_range_us / 1000, cell: (r) => ms(r.in_range_us / 1000), numeric: true, title: 'Their time inside the range (nested ops count in each op that holds them)' },
      { label: 'Total ms', value: (r) => r.total_us / 1000, cell: (r) => ms(r.total_us / 1000), numeric: true, title: 'Their whole durations, inside the range or not' },
    ],
  });
}

/** The phases' legend, and the time kept out of the step where its window held some. */
function apartLegend(d: StepDetail): HTMLElement {
  const out = legend(Object.keys(d.phases));
  const kinds = [...new Set(d.apart.map(([, , kind]) => asApart(kind)))];
  out.append(...kinds.flatMap((kind) => (kind ? [apartName(kind)] : [])));
  return out;
}

function memoryCurveCard(ctx: ViewContext, d: StepDetail): HTMLElement {
  const body = el('div', null, loading('Loading memory…'));
  const out = card('Memory over the step', body);
  void (async () => {
    const answer = await ctx.api.memory(d.run, d.worker, d.step).catch(() => null);
    if (!ctx.scope.live) return;
    if (!answer) {
      replace(body, notice('The memory of this step could not be read.'));
    } else if (!answer.recorded) {
      replace(body, notice(el('strong', null, 'No memory events in this trace. '),
        'Profile with ', el('code', null, 'profile_memory=True'), ' (PhaseProfiler(profile_memory=True) or torch.profiler.profile(profile_memory=True)) to see memory over the step.'));
    } else if (!answer.devices.length) {
      replace(body, notice('No memory event in this step.'));
    } else {
      const box = chartBox(240);
      replace(
        body,
        baselineNote(answer.devices),
        el('div', { class: 'figures' }, ...answer.devices.map((s) =>
          figure(s.baseline ? `Peak ${s.device}` : `Peak ${s.device} (since profiling began)`, bytes(s.peak_bytes),
            `at ${ms(s.peak_ms)} ms from the step's start${s.baseline ? '' : '; not counting what was allocated before profiling began'}`))),
        box,
        el('p', { class: 'hint' }, 'Allocated bytes after each memory event (dashed: reserved by the caching allocator), the phases shaded beneath. ',
          el('button', { type: 'button', class: 'link', title: 'Every allocation and free of this step, with its op, and memory by op', onclick: () => ctx.go({ view: 'memory', step: d.step }) }, 'Memory events and memory by op')),
      );
      drawMemory(mountChart(box, ctx.scope), answer);
    }
  })();
  return out;
}

/** Devices whose curve starts from zero at the trace's first memory event, said in a sentence. */
function baselineNote(devices: MemorySeries[]): HTMLElement | null {
  const without = devices.filter((s) => !s.baseline).map((s) => s.device);
  if (!without.length) return null;
  return notice(
    el('strong', null, `No allocation baseline for ${without.join(', ')}: `),
    'the trace counts memory from the first allocation the profiler saw, so what was allocated before profiling began ',
    '(the model’s weights, optimizer state, data already on the device) is not in this curve nor in its peak. ',
    'The memory in use is higher by that much (on a GPU, torch.cuda.memory_allocated() before profiling says how much).',
  );
}

function kernelsCard(ctx: ViewContext, d: StepDetail): HTMLElement {
  const body = el('div', null, loading('Loading kernels…'));
  const out = card(`Kernels of step ${d.step}`, body);
  void (async () => {
    const answer = await ctx.api.kernels(d.run, d.worker, d.step).catch((error) => error as Error);
    if (!ctx.scope.live) return;
    if (answer instanceof Error) {
      replace(body, failure('the kernels', answer));
      return;
    }
    replace(body, kernelsTable(ctx, answer.kernels, KERNELS_SHOWN));
  })();
  return out;
}

/** Kernels by name: calls, device time, the op and phase that launched them. */
export function kernelsTable(ctx: ViewContext, kernels: KernelRow[], limit?: number): HTMLElement {
  const shown = kernelLabels(kernels.map((k) => k.name));
  const out = table<KernelRow>({
    label: 'Kernels',
    rows: kernels,
    limit,
    sortBy: 2,
    empty: 'No GPU work recorded.',
    columns: [
      { label: 'Kernel', value: (k) => k.name, cell: (k) => opName(k.name, shown.get(k.name)), title: 'Names shortened only as far as they stay distinct; the full name on hover and in the CSV' },
      { label: 'Calls', value: (k) => k.calls, numeric: true },
      { label: 'Total µs', value: (k) => k.total_us, cell: (k) => k.total_us.toFixed(1), numeric: true },
      { label: 'Mean µs', value: (k) => k.mean_us, cell: (k) => k.mean_us.toFixed(1), numeric: true },
      { label: 'Max µs', value: (k) => k.max_us, cell: (k) => k.max_us.toFixed(1), numeric: true },
      { label: 'Share', value: (k) => k.share, cell: (k) => pct(k.share), numeric: true, title: 'Of the kernel time of the kernels listed (device time summed over streams)' },
      {
        label: 'Launched by',
        value: (k) => k.op,
        cell: (k) => opLink(ctx, k.op, k.ops.length > 1 ? `${k.op} (+${k.ops.length - 1})` : k.op),
        title: 'The op that launched most of its time',
      },
      { label: 'Phase', value: (k) => k.phase, cell: (k) => phaseName(k.phase) },
      ...launchColumns,
    ],
  });
  out.classList.add('kernels-table'); // fifteen columns: compact, headers wrap
  return out;
}

/** `[x, y, z]` as `x×y×z` (empty where not recorded). */
const dims = (d: number[] | null): string => (d ? d.join('×') : '');
/** What a grid or block sorts by: how many blocks or threads it holds. */
const volume = (d: number[] | null): number | null => (d ? d.reduce((a, b) => a * b, 1) : null);
const orDash = (text: string): string => text || '—';

/** A kernel's launch, where the trace records it (copies, sets and older traces: blank). */
const launchColumns: Column<KernelRow>[] = [
  { label: 'Blocks/SM', value: (k) => k.blocks_per_sm, cell: (k) => orDash(k.blocks_per_sm === null ? '' : k.blocks_per_sm.toFixed(2)), numeric: true, title: 'Blocks per SM, mean weighted by each call’s duration (under 1: the kernel leaves SMs idle)' },
  { label: 'Occupancy', value: (k) => k.occupancy, cell: (k) => orDash(k.occupancy === null ? '' : `${k.occupancy.toFixed(1)}%`), numeric: true, title: 'Estimated achieved occupancy (the profiler’s occupancy calculator), mean weighted by each call’s duration' },
  { label: 'Grid', value: (k) => volume(k.grid), cell: (k) => orDash(dims(k.grid)), csv: (k) => dims(k.grid), numeric: true, title: 'Blocks in the grid (x×y×z) of the longest call; sorts by their number' },
  { label: 'Block', value: (k) => volume(k.block), cell: (k) => orDash(dims(k.block)), csv: (k) => dims(k.block), numeric: true, title: 'Threads per block (x×y×z) of the longest call; sorts by their number' },
  { label: 'Registers', value: (k) => k.registers, cell: (k) => orDash(k.registers === null ? '' : String(k.registers)), numeric: true, title: 'Registers per thread, of the longest call' },
  { label: 'Shared mem', value: (k) => k.shared_memory, cell: (k) => orDash(k.shared_memory === null ? '' : bytes(k.shared_memory)), numeric: true, title: 'Shared memory per block, of the longest call (bytes in the CSV)' },
  { label: 'Tensor cores', value: (k) => (k.tensor_cores === null ? null : Number(k.tensor_cores)), cell: (k) => (k.tensor_cores === null ? '—' : k.tensor_cores ? 'yes' : 'no'), csv: (k) => (k.tensor_cores === null ? '' : k.tensor_cores ? 'yes' : 'no'), title: 'Whether it runs on tensor cores, read from its name (the trace records no flag)' },
];

/** An op name that opens the Operators view on that op. */
export function opLink(ctx: ViewContext, name: string, text = name): HTMLElement {
  return el('button', { type: 'button', class: 'link op', title: `${name}: open in Operators`, onclick: (e: Event) => {
    e.stopPropagation();
    ctx.go({ view: 'operators', op: name, phase: '' });
  } }, text);
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

function opsCard(ctx: ViewContext, d: StepDetail): HTMLElement {
  const gpu = d.gpu_idle_ms !== null;
  const sections = Object.entries(d.ops)
    .filter(([, ops]) => ops.length)
    .map(([phase, ops]) =>
      el(
        'div',
        { class: 'ops-phase' },
        el('h4', null, phaseName(phase), el('span', { class: 'muted' }, ` ${ops.length} ops · ${ms(d.phases[phase].host_ms)} ms`)),
        opsTable(ops, { gpu, limit: OPS_SHOWN, shapes: true, label: `Ops of ${phase} in step ${d.step}`, name: (o) => opLink(ctx, o.name) }),
      ),
    );
  return card('Ops by phase', ...(sections.length ? sections : [el('p', { class: 'empty' }, 'No ops recorded in this step.')]));
}
