/**
 * Overview of one worker of a run: a stacked bar per profiled step, the mean phases and their
 * shares, the findings, on GPU runs the mean step's GPU measures, streams and critical path, the
 * slowest step and why, the top ops of the dominant phase, every step.
 * Time in a step's window kept out of the step (an evaluation pass, a paused block) is never in its
 * bar: the tooltip, the step's notes and columns of their own say how much there was.
 */

import { drawStackedBars } from '../charts/stacked_bars';
import { mountChart } from '../charts/echarts';
import { tooltipBody, type TooltipRow } from '../charts/tooltip';
import { badge, button, card, chartBox, figure, figures, legend, phaseName } from '../components/layout';
import { measuresCard, pathCard, streamsCard } from '../components/gpu_time';
import { notice } from '../components/status';
import { opName, opsTable } from '../components/ops_table';
import { table, type Column } from '../components/table';
import { el, replace } from '../dom';
import { ms, pct, signedMs } from '../format';
import { apartLabel, apartOf } from '../apart';
import type { ChangedOp, Device, Finding, PhaseMean, PhaseTimes, StepRow, StepsAnswer } from '../types';
import { fetchInto, findRun, noSteps, type View, type ViewContext } from './view';

export const overview: View = {
  keys: ['run', 'worker', 'device'],
  async render(ctx) {
    const { run, worker } = ctx.state;
    const info = findRun(ctx.runs, run);
    if (info && !info.workers.length) {
      replace(
        ctx.root,
        notice(
          `Run ${run} has no trace files yet, only its per-step timings. `,
          button('Open the timeline', () => ctx.go({ view: 'timeline' })),
        ),
      );
      return;
    }
    const data = await fetchInto(ctx, `the steps of ${run}`, () => ctx.api.steps(run, worker));
    if (!data) return;
    if (!data.steps.length) {
      replace(ctx.root, noSteps(info, data.worker));
      return;
    }
    const device: Device = ctx.state.device === 'gpu' && data.gpu ? 'gpu' : 'cpu';
    replace(
      ctx.root,
      headline(data),
      device !== ctx.state.device ? notice('No GPU activity in these traces: the figures are host (CPU) time.') : null,
      stepsCard(ctx, data, device),
      el('div', { class: 'columns' }, phasesCard(data), findingsCard(data)),
      gpuSummary(data),
      el('div', { class: 'columns' }, slowestCard(ctx, data), topOpsCard(data)),
      stepTableCard(ctx, data, device),
    );
  },
};

function headline(data: StepsAnswer): HTMLElement {
  const s = data.summary;
  const profiled = s.empty_steps.length ? `${s.steps} (${s.empty_steps.length} empty)` : String(s.steps);
  return figures(
    figure('Mean step', `${ms(s.mean_wall_ms)} ms`, 'Mean wall time of the profiled steps (empty steps left out)'),
    figure('Median step', `${ms(s.median_wall_ms)} ms`),
    figure('Profiled steps', profiled),
    figure('Costliest phase', s.dominant_phase ? phaseName(s.dominant_phase) : '–', measureHint(s.measure)),
    figure('Device', data.gpu ? 'CPU + GPU' : 'CPU only'),
    s.eval_ms ? figure('Evaluation', `${ms(s.eval_ms)} ms`, 'Evaluation passes inside the profiled window, in all: outside the steps, in none of their figures') : null,
    s.paused_ms ? figure('Paused', `${ms(s.paused_ms)} ms`, 'prof.paused() blocks inside the profiled window, in all: outside the steps, in none of their figures') : null,
  );
}

function measureHint(measure: StepsAnswer['summary']['measure']): string {
  return measure === 'gpu'
    ? 'Most GPU time per step: the step is GPU-bound, so the GPU work a phase launches is what it adds'
    : 'Most host time per step: the host is the critical path (the GPU, if any, waits on it)';
}

function flags(data: StepsAnswer, row: StepRow): HTMLElement[] {
  const s = data.summary;
  const out: HTMLElement[] = [];
  if (s.outliers?.includes(row.step)) {
    // slow or fast as the backend judged it (summary.noise), never by a rule of the tab's own
    const slow = s.noise ? s.noise.slow.includes(row.step) : row.wall_ms > (s.median_wall_ms ?? 0);
    out.push(badge('outlier', 'danger', `${slow ? 'Slower' : 'Faster'} than the median step beyond the steps' noise`));
  }
  if (row.inferred_step) out.push(badge('inferred step', 'muted', "The trace marks no steps: cut from the loop's repeated marks"));
  if (row.empty) out.push(badge('empty', 'muted', 'The loop ended inside the profiled window: left out of averages'));
  if (row.inferred_phases.length) {
    out.push(badge(`inferred: ${row.inferred_phases.join(', ')}`, 'muted', 'Phase boundaries inferred from the ops'));
  }
  if (s.warmup_steps?.includes(row.step)) {
    out.push(badge('warm-up', 'muted', 'One-off setup (stream, event and handle creation, autotuning) took this step: left out of the means, findings and the chart’s scale'));
  }
  if (s.compiling_steps?.includes(row.step)) {
    out.push(badge('compiled', 'muted', 'torch.compile compiled in this step (its compile phase): left out of the means and findings'));
  }
  return out;
}

function stepsCard(ctx: ViewContext, data: StepsAnswer, device: Device): HTMLElement {
  const rows = data.steps;
  const outliers = new Set(data.summary.outliers ?? []);
  const box = chartBox(260);
  const median = data.summary.median_wall_ms ?? 0;
  const flagged = rows.filter((r) => outliers.has(r.step) || r.empty);
  const out = card(
    `Phases per step (${device === 'gpu' ? 'GPU busy' : 'CPU'} time)`,
    legend(data.phases),
    box,
    el('p', { class: 'hint' }, 'Click a bar to open that step.'),
    flagged.length
      ? el(
          'ul',
          { class: 'flags' },
          ...flagged.map((r) =>
            el(
              'li',
              null,
              ...flags(data, r),
              ` step ${r.step}: ${ms(r.wall_ms)} ms`,
              median && !r.empty ? ` (${(r.wall_ms / median).toFixed(1)}× the median step)` : '',
            ),
          ),
        )
      : null,
  );
  const apart = stepsApart(data);
  if (apart.size) out.append(scaleNote(apart));
  const chart = mountChart(box, ctx.scope);
  drawStackedBars(chart, {
    offScale: (i) => apart.has(rows[i].step),
    categories: rows.map((r) => String(r.step)),
    phases: data.phases,
    value: (phase, i) => phaseMs(rows[i].phases[phase], device),
    valueName: device === 'gpu' ? 'ms (GPU busy)' : 'ms (CPU)',
    flagged: (i) => outliers.has(rows[i].step) || rows[i].empty,
    tooltip: (i) => stepTooltip(data, rows[i], device),
    onPick: (i) => ctx.go({ view: 'step', step: rows[i].step }),
  });
  return out;
}

/** Steps left out of the means, findings and the chart's scale: warm-up and compiling steps, with why. */
function stepsApart(data: StepsAnswer): Map<number, string> {
  const s = data.summary;
  const warmup = s.warmup_steps ?? [];
  const out = new Map<number, string>();
  for (const n of warmup) out.set(n, 'warm-up');
  for (const n of s.compiling_steps ?? []) out.set(n, out.has(n) ? 'warm-up, compiled' : 'compiled');
  return out;
}

function scaleNote(apart: Map<number, string>): HTMLElement {
  const list = [...apart].map(([n, why]) => `${n} (${why})`).join(', ');
  return el(
    'p',
    { class: 'hint' },
    `Step${apart.size > 1 ? 's' : ''} ${list} ${apart.size > 1 ? 'are' : 'is'} drawn but left out of the chart’s scale, as of the means and findings: `,
    'a bar taller than the others is cut at the top, marked ▲ with its total (ms).',
  );
}

function stepTooltip(data: StepsAnswer, row: StepRow, device: Device): HTMLElement {
  const lines: TooltipRow[] = [...data.phases]
    .reverse()
    .map((phase) => ({ phase, label: phase, value: `${ms(phaseMs(row.phases[phase], device))} ms` }));
  lines.push({ label: device === 'gpu' ? 'GPU busy' : 'step (wall)', value: `${ms(device === 'gpu' ? (row.gpu_time?.busy_ms ?? 0) : row.wall_ms)} ms`, strong: true });
  for (const { kind, ms: host, gpuMs } of apartOf(row)) {
    lines.push({ apart: kind, label: apartLabel(kind), value: `${ms(device === 'gpu' ? gpuMs : host)} ms` });
  }
  const notes = flags(data, row).map((b) => b.textContent).join(' · ');
  return tooltipBody(`Step ${row.step}`, lines, notes || 'click to open');
}

/**
 * The mean step by phase. Every share is of a total in its own measure: host time of the mean step's
 * wall time, GPU busy time of the mean step's GPU busy time; kernel time (summed over streams, so more
 * than busy where streams overlap) gets no share.
 */
function phasesCard(data: StepsAnswer): HTMLElement {
  const mean = data.summary.mean ?? {};
  type Row = PhaseMean & { phase: string };
  const rows: Row[] = data.phases.map((phase) => ({ phase, ...mean[phase] }));
  const columns: Column<Row>[] = [
    { label: 'Phase', value: (r) => r.phase, cell: (r) => phaseName(r.phase) },
    { label: 'Host ms', value: (r) => r.host_ms, cell: (r) => ms(r.host_ms), numeric: true },
    { label: 'Host share', value: (r) => r.share, cell: (r) => pct(r.share), numeric: true, title: 'Share of the mean step’s host (wall) time' },
  ];
  const costs = data.summary.costs ?? {};
  const costColumn: Column<Row> = {
    label: `Cost ms (${data.summary.measure === 'gpu' ? 'GPU' : 'host'})`,
    value: (r) => costs[r.phase] ?? null,
    cell: (r) => ms(costs[r.phase] ?? 0),
    numeric: true,
    title: measureHint(data.summary.measure),
  };
  if (data.gpu) {
    const comm = rows.some((r) => r.comm_ms);
    columns.push(
      { label: 'GPU busy ms', value: (r) => r.gpu_busy_ms, cell: (r) => ms(r.gpu_busy_ms), numeric: true, title: 'GPU busy time of the work the phase launched: over all streams, an instant counted once' },
      { label: 'GPU share', value: (r) => r.gpu_share, cell: (r) => pct(r.gpu_share), numeric: true, title: 'Share of the mean step’s GPU busy time' },
      { label: 'Kernel ms', value: (r) => r.gpu_ms, cell: (r) => ms(r.gpu_ms), numeric: true, title: 'Kernel time: device time summed over streams (more than busy time where streams overlap)' },
      ...(comm
        ? [
            { label: 'Comm ms', value: (r: Row) => r.comm_ms, cell: (r: Row) => ms(r.comm_ms), numeric: true, title: 'GPU busy time of collectives (NCCL, …): communication, not compute' },
            { label: 'Exposed comm ms', value: (r: Row) => r.exposed_comm_ms, cell: (r: Row) => ms(r.exposed_comm_ms), numeric: true, title: 'Communication with no compute on any stream' },
          ]
        : []),
      { label: 'GPU idle ms', value: (r) => r.gpu_idle_ms, cell: (r) => ms(r.gpu_idle_ms), numeric: true, title: 'Host time of the phase with no device activity' },
    );
  }
  columns.push(costColumn);
  return card('Mean step by phase', table({ label: 'Mean step by phase', rows, columns }), gpuNote(data));
}

/** The mean step's GPU measures in a line: busy, kernel time, window, and the host running ahead. */
function gpuNote(data: StepsAnswer): HTMLElement | null {
  const g = data.summary.gpu_time;
  if (!g) return null;
  const comm = g.comm_ms
    ? ` Communication ${ms(g.comm_ms)} ms, ${ms(g.exposed_comm_ms)} ms of it exposed (no compute beside it)${g.overlap !== null ? `; ${pct(g.overlap)} overlapped by compute` : ''}.`
    : '';
  const ahead = g.past_host_ms > 0 ? ` The GPU work runs ${ms(g.past_host_ms)} ms past the step’s host window: the host runs ahead of the GPU.` : '';
  return el(
    'p',
    { class: 'hint' },
    `Mean step on the GPU: busy ${ms(g.busy_ms)} ms (compute ${ms(g.compute_ms)} ms), kernel time ${ms(g.kernel_ms)} ms summed over streams, window ${ms(g.window_ms)} ms from first to last activity.${comm}${ahead}`,
  );
}

/** The mean step on the GPU: its four measures, streams and critical path (GPU runs only). */
function gpuSummary(data: StepsAnswer): HTMLElement | null {
  const s = data.summary;
  const g = s.gpu_time;
  if (!g) return null;
  const cut = (s.cut_steps ?? []).map((n): [number, string] => [n, 'cut by the trace’s end']);
  const apart = [...stepsApart(data), ...cut];
  const kept = apart.length
    ? el('p', { class: 'hint left-out' },
        `Means over the steps kept: step${apart.length > 1 ? 's' : ''} `,
        apart.map(([n, why]) => `${n} (${why})`).join(', '),
        ' left out, as from every mean and finding.')
    : null;
  const measures = measuresCard(g, 'GPU time of the mean step', kept);
  const streams = streamsCard(g, 'GPU streams of the mean step');
  return s.critical_path
    ? el('div', { class: 'columns gpu-summary' }, el('div', { class: 'stack' }, measures, streams),
        pathCard(s.critical_path, 'Critical path of the mean step'))
    : el('div', { class: 'columns gpu-summary' }, measures, streams);
}

/** A phase's figure in the chosen measure: host time, or GPU busy time. */
function phaseMs(times: PhaseTimes, device: Device): number {
  return device === 'gpu' ? times.gpu_busy_ms : times.host_ms;
}

function findingsCard(data: StepsAnswer): HTMLElement {
  const findings = data.summary.findings;
  return card(
    'Findings',
    findings.length
      ? el('ul', { class: 'findings' }, ...findings.map(findingItem))
      : el('p', { class: 'empty' }, 'Nothing stands out: the phases look balanced.'),
  );
}

const WHAT_IF = 'With what it names gone, the step would still take at least this: '
  + 'the critical path’s length without its time';

/** A finding: its sentence, its estimated saving, and the evidence behind it on demand. */
function findingItem(f: Finding): HTMLElement {
  const evidence = Object.entries(f.evidence);
  return el(
    'li',
    { class: `finding finding-${f.kind}` },
    f.saving_ms !== null ? el('span', { class: 'saving', title: 'Estimated time per step it could save' }, `≤ ${ms(f.saving_ms)} ms`) : null,
    f.what_if_ms !== undefined && f.what_if_ms !== null
      ? el('span', { class: 'what-if', title: WHAT_IF }, `step ≥ ${ms(f.what_if_ms)} ms without it`)
      : null,
    el('span', { class: 'finding-text' }, f.text),
    evidence.length
      ? el(
          'details',
          { class: 'evidence' },
          el('summary', null, 'Evidence'),
          el('dl', null, ...evidence.flatMap(([k, v]) => [el('dt', null, k.replace(/_/g, ' ')), el('dd', null, Array.isArray(v) ? v.join(', ') : String(v))])),
        )
      : null,
  );
}

function slowestCard(ctx: ViewContext, data: StepsAnswer): HTMLElement {
  const slow = data.summary.slowest;
  if (!slow) return card('Slowest step', el('p', { class: 'empty' }, 'No step holds any work.'));
  const open = button(`Open step ${slow.step}`, () => ctx.go({ view: 'step', step: slow.step }));
  if (slow.noise !== 'beyond-noise' || slow.median_step === undefined || !slow.phase) {
    // The outliers are the backend's (summary.outliers), as the badges and findings: a slowest step
    // within the noise says which steps do stand out (faster ones) rather than that none does.
    const noise = data.summary.noise;
    const others = (noise ? noise.fast : (data.summary.outliers ?? [])).filter((n) => n !== slow.step);
    const why =
      slow.noise === 'too-few-steps'
        ? `Too few steps to tell it from noise${noise ? ` (at least ${noise.min_steps})` : ''}.`
        : `Within the steps' noise (±${ms(slow.noise_ms ?? 0)} ms of the median step, ${ms(data.summary.median_wall_ms)} ms)` +
          (others.length
            ? `; step${others.length > 1 ? 's' : ''} ${others.join(', ')} stand${others.length > 1 ? '' : 's'} out, faster than the median step (flagged above).`
            : ': no step stands out.');
    return card('Slowest step', el('p', null, `Step ${slow.step}: ${ms(slow.wall_ms)} ms. ${why}`), open);
  }
  const typical = slow.median_step;
  const side = { run: data.run, worker: data.worker };
  return card(
    'Slowest step',
    el(
      'p',
      { class: 'slowest' },
      `Step ${slow.step} took ${ms(slow.wall_ms)} ms, ${signedMs(slow.vs_median_ms ?? 0)} ms against the median step ${typical}, `,
      `beyond the steps' noise (±${ms(slow.noise_ms ?? 0)} ms); `,
      `most of the difference is in `,
      phaseName(slow.phase),
      ` (${signedMs(slow.phase_delta_ms ?? 0)} ms).`,
    ),
    slow.ops?.length ? changedOpsTable(slow.ops, `step ${typical}`, `step ${slow.step}`) : null,
    el(
      'div',
      { class: 'actions' },
      open,
      button(`Compare with step ${typical}`, () =>
        ctx.go({ view: 'compare', a: { ...side, step: typical }, b: { ...side, step: slow.step } }),
      ),
    ),
  );
}

function changedOpsTable(ops: ChangedOp[], a: string, b: string): HTMLElement {
  return table({
    label: 'Ops that grew most',
    rows: ops,
    columns: [
      { label: 'Op', value: (o) => o.name, cell: (o) => opName(o.name) },
      { label: `Self host ms, ${a}`, value: (o) => o.a_self_host_ms, cell: (o) => ms(o.a_self_host_ms), numeric: true },
      { label: `Self host ms, ${b}`, value: (o) => o.b_self_host_ms, cell: (o) => ms(o.b_self_host_ms), numeric: true },
      { label: 'Δ self host ms', value: (o) => o.delta_self_host_ms, cell: (o) => signedMs(o.delta_self_host_ms), numeric: true },
    ],
  });
}

function topOpsCard(data: StepsAnswer): HTMLElement {
  const phase = data.summary.dominant_phase;
  const ops = data.summary.top_ops ?? [];
  return card(
    el('span', null, 'Top ops of ', phase ? phaseName(phase) : '–', `, the costliest phase (per step, by self ${data.summary.measure === 'gpu' ? 'GPU' : 'CPU'} time)`),
    opsTable(ops, { gpu: data.gpu, bySelfGpu: data.summary.measure === 'gpu' }),
  );
}

function stepTableCard(ctx: ViewContext, data: StepsAnswer, device: Device): HTMLElement {
  // time kept out of the steps: a column of its own, after the phases, only where some step held any
  const gpu = device === 'gpu';
  const apart = (['eval', 'paused'] as const)
    .filter((kind) => data.steps.some((r) => apartOf(r).some((o) => o.kind === kind)))
    .map((kind): Column<StepRow> => {
      const value = (r: StepRow) => (kind === 'eval' ? (gpu ? r.eval_gpu_ms : r.eval_ms) : gpu ? r.paused_gpu_ms : r.paused_ms);
      return {
        label: `${kind === 'eval' ? 'Evaluation' : 'Paused'} ms (outside)`,
        value,
        cell: (r) => (value(r) ? ms(value(r)) : ''),
        numeric: true,
        title: `${apartLabel(kind)}: inside the step's window, kept out of the step (not in its wall time or phases)`,
      };
    });
  return card(
    `Every profiled step (${gpu ? 'GPU busy' : 'CPU'} ms)`,
    table({
      label: 'Profiled steps',
      rows: data.steps,
      limit: 50,
      onRowClick: (r) => ctx.go({ view: 'step', step: r.step }),
      rowClass: (r) => (data.summary.outliers?.includes(r.step) ? 'flagged' : r.empty ? 'muted' : ''),
      columns: [
        { label: 'Step', value: (r) => r.step, numeric: true },
        { label: 'Wall ms', value: (r) => r.wall_ms, cell: (r) => ms(r.wall_ms), numeric: true },
        ...(gpu
          ? [{ label: 'GPU busy ms', value: (r: StepRow) => r.gpu_time?.busy_ms ?? null, cell: (r: StepRow) => ms(r.gpu_time?.busy_ms), numeric: true, title: 'Device activity over all streams, an instant counted once' }]
          : []),
        ...data.phases.map((phase) => ({
          label: phase,
          value: (r: StepRow) => phaseMs(r.phases[phase], device),
          cell: (r: StepRow) => ms(phaseMs(r.phases[phase], device)),
          numeric: true,
        })),
        ...apart,
        { label: 'Notes', value: () => null, cell: (r) => el('span', { class: 'notes' }, ...flags(data, r)) },
      ],
    }),
  );
}
