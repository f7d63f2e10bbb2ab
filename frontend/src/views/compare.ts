/** Two runs, two workers or two steps side by side: per-phase deltas and the ops that changed most. */

import { mountChart } from '../charts/echarts';
import { drawStackedBars } from '../charts/stacked_bars';
import { tooltipBody } from '../charts/tooltip';
import { select } from '../components/controls';
import { button, card, chartBox, figure, figures, legend, phaseName } from '../components/layout';
import { opName } from '../components/ops_table';
import { notice } from '../components/status';
import { table } from '../components/table';
import { el, replace } from '../dom';
import { change, count, ms, signedMs } from '../format';
import type { Side } from '../state';
import type { ChangedOp, CompareAnswer, CompareSide, Device, StepsAnswer } from '../types';
import { defaultWorker, deviceLabel, fetchInto, findRun, onDevice, type View, type ViewContext } from './view';

type SideKey = 'a' | 'b';

export const compare: View = {
  keys: ['a', 'b', 'device', 'op'],
  async render(ctx) {
    const { a, b } = ctx.state;
    if (!a.run || !b.run) {
      const sides = await defaultSides(ctx);
      if (!ctx.scope.live) return;
      if (sides) ctx.go(sides, { replace: true });
      else replace(ctx.root, notice('Nothing to compare yet: no run has trace files.'));
      return;
    }
    const sides = el('div', { class: 'compare-sides' });
    const result = el('div', { class: 'view' });
    replace(ctx.root, sides, result);
    const [stepsA, stepsB] = await Promise.all([a, b].map((s) => ctx.api.steps(s.run, s.worker).catch(() => null)));
    if (!ctx.scope.live) return;
    replace(
      sides,
      sidePicker(ctx, 'a', stepsA),
      button('⇄ Swap', () => ctx.go({ a: ctx.state.b, b: ctx.state.a }), 'Swap A and B'),
      sidePicker(ctx, 'b', stepsB),
    );
    // In GPU time the ops are ranked by how much their GPU time changed.
    const device: Device = ctx.state.device === 'gpu' && (stepsA?.gpu || stepsB?.gpu) ? 'gpu' : 'cpu';
    const data = await fetchInto(ctx, 'the comparison', () => ctx.api.compare({ ...params(a, b), op: ctx.state.op, device }), result);
    if (!data) return;
    replace(result, headline(data, device), chartCard(ctx, data, device), phasesCard(data, device), opsCard(ctx, data, device));
  },
};

function params(a: Side, b: Side) {
  return { run_a: a.run, worker_a: a.worker, step_a: a.step, run_b: b.run, worker_b: b.worker, step_b: b.step };
}

/** Two runs are compared by default only when this share of the op names either ran is common to
 * both (Jaccard similarity of their op names): runs of one model (another batch size, precision or
 * version) share nearly all their ops, runs of different models only the common ones. */
export const SAME_MODEL = 0.6;
/** At most this many other runs are looked at for a partner (their op names fetched). */
const PARTNERS_TRIED = 8;

type RunInfo = ViewContext['runs']['runs'][number];

async function opNames(ctx: ViewContext, run: RunInfo): Promise<Set<string> | null> {
  const answer = await ctx.api.ops(run.run, defaultWorker(run), 'name').catch(() => null);
  return answer && new Set(answer.ops.map((o) => o.name));
}

/** The run most like `current` (by its op names) that also ran `op` if one is asked about, if any
 * is alike enough (`SAME_MODEL`): never a run of another model. */
async function partnerRun(ctx: ViewContext, current: RunInfo, others: RunInfo[], op: string): Promise<RunInfo | null> {
  const tried = others.slice(0, PARTNERS_TRIED);
  const [mine, ...theirs] = await Promise.all([current, ...tried].map((r) => opNames(ctx, r)));
  if (!mine?.size) return null;
  let best: RunInfo | null = null;
  let bestScore = -1;
  tried.forEach((run, k) => {
    const names = theirs[k];
    if (!names?.size || (op && !names.has(op))) return;
    const common = [...names].filter((n) => mine.has(n)).length;
    const score = common / (mine.size + names.size - common);
    if (score >= SAME_MODEL && score > bestScore) {
      best = run;
      bestScore = score;
    }
  });
  return best;
}

/**
 * Something worth comparing: two runs of the same model (`partnerRun`), else two workers, else the
 * median and the slowest step.
 */
async function defaultSides(ctx: ViewContext): Promise<{ a: Side; b: Side } | null> {
  const traced = ctx.runs.runs.filter((r) => r.workers.length);
  if (!traced.length) return null;
  const current = traced.find((r) => r.run === ctx.state.run) ?? traced[0];
  const others = traced.filter((r) => r !== current);
  const other = others.length ? await partnerRun(ctx, current, others, ctx.state.op) : null;
  const whole = (run: typeof current): Side => ({ run: run.run, worker: defaultWorker(run), step: null });
  if (other) return { a: whole(current), b: whole(other) };
  if (current.workers.length > 1) {
    const first = defaultWorker(current);
    const second = current.workers.find((w) => w.worker !== first)!.worker;
    return { a: { ...whole(current), worker: first }, b: { ...whole(current), worker: second } };
  }
  const steps = await ctx.api.steps(current.run, defaultWorker(current)).catch(() => null);
  const slow = steps?.summary.slowest;
  const full = steps?.steps.filter((s) => !s.empty) ?? [];
  const pair =
    slow?.median_step !== undefined ? [slow.median_step, slow.step] : full.length ? [full[0].step, full[full.length - 1].step] : null;
  return pair ? { a: { ...whole(current), step: pair[0] }, b: { ...whole(current), step: pair[1] } } : null;
}

function sidePicker(ctx: ViewContext, key: SideKey, steps: StepsAnswer | null): HTMLElement {
  const side = ctx.state[key];
  const run = findRun(ctx.runs, side.run);
  const set = (patch: Partial<Side>) => ctx.go({ [key]: { ...side, ...patch } });
  const traced = ctx.runs.runs.filter((r) => r.workers.length);
  return el(
    'div',
    { class: 'compare-side' },
    el('span', { class: `side-tag side-${key}` }, key.toUpperCase()),
    select('Run', traced.map((r) => ({ value: r.run, label: r.run })), side.run, (value) => {
      const chosen = findRun(ctx.runs, value);
      set({ run: value, worker: chosen ? defaultWorker(chosen) : '', step: null });
    }),
    select('Worker', (run?.workers ?? []).map((w) => ({ value: w.worker, label: w.worker })), side.worker, (value) =>
      set({ worker: value, step: null }),
    ),
    select(
      'Step',
      [
        { value: '', label: 'all steps (mean)' },
        ...(steps?.steps ?? []).filter((s) => !s.empty).map((s) => ({ value: String(s.step), label: `step ${s.step}` })),
      ],
      side.step === null ? '' : String(side.step),
      (value) => set({ step: value === '' ? null : Number(value) }),
    ),
  );
}

function total(side: CompareSide, device: Device): number {
  return device === 'gpu' ? Object.values(side.phases).reduce((sum, p) => sum + p.gpu_ms, 0) : side.wall_ms;
}

function headline(data: CompareAnswer, device: Device): HTMLElement {
  const a = total(data.a, device);
  const b = total(data.b, device);
  const what = device === 'gpu' ? 'Kernel time per step' : 'Step (wall)';
  return figures(
    figure('A', el('span', { class: 'side-label' }, data.a.label)),
    figure('B', el('span', { class: 'side-label' }, data.b.label)),
    figure(`${what}, A`, `${ms(a)} ms`),
    figure(`${what}, B`, `${ms(b)} ms`),
    figure('B − A', el('span', { class: deltaClass(b - a) }, `${signedMs(b - a)} ms (${change(a, b)})`)),
  );
}

/** What the sides' phase figures measure: host time, or kernel time (device time summed over streams). */
function measureName(device: Device): string {
  return device === 'gpu' ? 'GPU kernel time' : 'CPU time';
}

function deltaClass(delta: number): string {
  return delta > 0 ? 'worse' : delta < 0 ? 'better' : '';
}

function chartCard(ctx: ViewContext, data: CompareAnswer, device: Device): HTMLElement {
  const box = chartBox(150);
  const sides = [data.a, data.b];
  const out = card(`Phases per step (${measureName(device)})`, legend(data.phases), box);
  drawStackedBars(mountChart(box, ctx.scope), {
    categories: ['A', 'B'],
    phases: data.phases,
    horizontal: true,
    value: (phase, i) => onDevice(sides[i].phases[phase], device),
    valueName: `ms (${measureName(device)})`,
    tooltip: (i) =>
      tooltipBody(
        `${'AB'[i]}: ${sides[i].label}`,
        [...data.phases].reverse().map((phase) => ({ phase, label: phase, value: `${ms(onDevice(sides[i].phases[phase], device))} ms` })),
      ),
  });
  return out;
}

function phasesCard(data: CompareAnswer, device: Device): HTMLElement {
  const rows = [
    ...data.phases.map((phase) => ({
      phase,
      a: onDevice(data.a.phases[phase], device),
      b: onDevice(data.b.phases[phase], device),
      delta: onDevice(data.delta.phases[phase], device),
    })),
  ];
  const a = total(data.a, device);
  const b = total(data.b, device);
  rows.push({ phase: '', a, b, delta: device === 'gpu' ? b - a : data.delta.wall_ms });
  return card(
    `Per phase (${measureName(device)}, ms per step)`,
    table({
      label: 'Per-phase deltas',
      rows,
      rowClass: (r) => (r.phase ? '' : 'total'),
      columns: [
        { label: 'Phase', value: (r) => r.phase, cell: (r) => (r.phase ? phaseName(r.phase) : device === 'gpu' ? 'kernel time' : 'step (wall)') },
        { label: 'A ms', value: (r) => r.a, cell: (r) => ms(r.a), numeric: true },
        { label: 'B ms', value: (r) => r.b, cell: (r) => ms(r.b), numeric: true },
        { label: 'Δ ms (B − A)', value: (r) => r.delta, cell: (r) => el('span', { class: deltaClass(r.delta) }, signedMs(r.delta)), numeric: true },
        { label: 'Change', value: (r) => (r.a ? (r.b - r.a) / r.a : null), cell: (r) => change(r.a, r.b), numeric: true },
      ],
    }),
  );
}

/**
 * The ops that changed most, with the A and B columns of the time in use (host or GPU); an op
 * opened from elsewhere (`op`) comes first, marked.
 */
function opsCard(ctx: ViewContext, data: CompareAnswer, device: Device): HTMLElement {
  const delta = (value: number) => el('span', { class: deltaClass(value) }, signedMs(value));
  const wanted = ctx.state.op;
  const rows = wanted ? [...data.ops.filter((o) => o.name === wanted), ...data.ops.filter((o) => o.name !== wanted)] : data.ops;
  const found = wanted && rows.length && rows[0].name === wanted;
  const gpu = data.ops.some((o) => o.a_gpu_ms || o.b_gpu_ms);
  const side = device === 'gpu'
    ? ([
        { label: 'Self GPU A', value: (o: ChangedOp) => o.a_self_gpu_ms, cell: (o: ChangedOp) => ms(o.a_self_gpu_ms), numeric: true },
        { label: 'Self GPU B', value: (o: ChangedOp) => o.b_self_gpu_ms, cell: (o: ChangedOp) => ms(o.b_self_gpu_ms), numeric: true },
        { label: 'Δ self GPU', value: (o: ChangedOp) => o.delta_self_gpu_ms, cell: (o: ChangedOp) => delta(o.delta_self_gpu_ms), numeric: true },
        { label: 'Δ GPU', value: (o: ChangedOp) => o.delta_gpu_ms, cell: (o: ChangedOp) => delta(o.delta_gpu_ms), numeric: true, title: 'Device time launched within the op' },
      ])
    : ([
        { label: 'Self host A', value: (o: ChangedOp) => o.a_self_host_ms, cell: (o: ChangedOp) => ms(o.a_self_host_ms), numeric: true },
        { label: 'Self host B', value: (o: ChangedOp) => o.b_self_host_ms, cell: (o: ChangedOp) => ms(o.b_self_host_ms), numeric: true },
        { label: 'Δ self CPU', value: (o: ChangedOp) => o.delta_self_host_ms, cell: (o: ChangedOp) => delta(o.delta_self_host_ms), numeric: true },
        { label: 'Δ CPU', value: (o: ChangedOp) => o.delta_host_ms, cell: (o: ChangedOp) => delta(o.delta_host_ms), numeric: true, title: 'Host time including called ops' },
        ...(gpu ? [{ label: 'Δ GPU', value: (o: ChangedOp) => o.delta_gpu_ms, cell: (o: ChangedOp) => delta(o.delta_gpu_ms), numeric: true, title: 'Device time launched within the op' }] : []),
      ]);
  return card(
    `Ops that changed most (${deviceLabel(device)} ms per step)`,
    wanted && !found ? notice(`${wanted} did not run on either side.`) : null,
    table<ChangedOp>({
      label: 'Ops that changed most',
      rows,
      limit: found ? Math.max(15, rows.filter((o) => o.name === wanted).length) : 15,
      empty: 'No op changed.',
      rowClass: (o) => (o.name === wanted ? 'selected' : ''),
      columns: [
        { label: 'Phase', value: (o) => o.phase, cell: (o) => phaseName(o.phase) },
        { label: 'Op', value: (o) => o.name, cell: (o) => opName(o.name) },
        { label: 'Calls A', value: (o) => o.a_calls, cell: (o) => count(o.a_calls), numeric: true },
        { label: 'Calls B', value: (o) => o.b_calls, cell: (o) => count(o.b_calls), numeric: true },
        ...side,
      ],
    }),
  );
}
