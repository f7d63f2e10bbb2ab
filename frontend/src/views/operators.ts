/**
 * Every op of a worker over all its profiled steps, as `key_averages().table()` lists them: search,
 * sort on any column (self CPU time first), one row per op or per op and input shapes, one phase or
 * all; each op links to the steps it ran in and to Compare. Then the kernels of the run (GPU runs).
 */

import { segmented, select } from '../components/controls';
import { card, figure, figures, leftOutNote, swatch } from '../components/layout';
import { codeColumn, opName } from '../components/ops_table';
import { table, type Column } from '../components/table';
import { el, replace } from '../dom';
import { count, ms, pct, thousands } from '../format';
import type { OpsAnswer, RunOpRow } from '../types';
import { kernelsTable } from './step';
import { fetchInto, overSteps, type View, type ViewContext } from './view';

/** Steps listed in an op's row before "…". */
const STEPS_SHOWN = 3;

export const operators: View = overSteps({
  keys: ['run', 'worker', 'group', 'phase'],
  nothing: 'no ops to list',
  async render(ctx, steps) {
    const { run, group, phase } = ctx.state;
    const body = el('div', { class: 'view' });
    replace(ctx.root, body);
    const answer = await fetchInto(ctx, `the ops of ${run}`, () => ctx.api.ops(run, steps.worker, group, phase), body);
    if (!answer) return;
    replace(
      body,
      controls(ctx, steps.phases),
      figures(
        figure('Steps', thousands(answer.steps), 'Profiled steps the figures cover'),
        figure('Ops', thousands(answer.ops.length)),
        figure(phase ? `Host time in ${phase}` : 'Host time', `${ms(answer.wall_ms)} ms`),
        steps.gpu ? figure(phase ? `GPU time of ${phase}` : 'GPU time', `${ms(answer.gpu_ms)} ms`) : null,
      ),
      leftOutNote({ ...answer, step: null }),
      opsCard(ctx, answer, steps.gpu),
      steps.gpu ? kernelsCard(ctx, steps.worker) : null,
    );
  },
});

function controls(ctx: ViewContext, phases: string[]): HTMLElement {
  return el(
    'div',
    { class: 'step-nav' },
    segmented(
      'Rows',
      [
        { value: 'name', label: 'By op', title: 'One row per op name' },
        { value: 'shapes', label: 'By op and shapes', title: 'One row per op name and input shapes' },
      ],
      ctx.state.group,
      (value) => ctx.go({ group: value === 'shapes' ? 'shapes' : 'name' }, { replace: true }),
    ),
    select('Phase', [{ value: '', label: 'all phases' }, ...phases.map((p) => ({ value: p, label: p }))], ctx.state.phase, (value) =>
      ctx.go({ phase: value }, { replace: true }),
    ),
  );
}

function opsCard(ctx: ViewContext, answer: OpsAnswer, gpu: boolean): HTMLElement {
  const holder = el('div');
  const search = el('input', {
    type: 'search',
    class: 'search',
    placeholder: 'Search ops',
    'aria-label': 'Search ops',
    value: ctx.state.op,
  });
  const draw = () => {
    const needle = search.value.trim().toLowerCase();
    const rows = needle ? answer.ops.filter((o) => o.name.toLowerCase().includes(needle) || (o.shapes ?? '').toLowerCase().includes(needle)) : answer.ops;
    replace(holder, opsTable(ctx, rows, answer, gpu, search));
  };
  search.addEventListener('input', () => {
    draw();
    search.focus();
    ctx.go({ op: search.value.trim() }, { replace: true });
  });
  draw();
  const title = `Operators${answer.phase ? ` of ${answer.phase}` : ''} over ${thousands(answer.steps)} profiled steps`;
  return card(title, holder);
}

function opsTable(ctx: ViewContext, rows: RunOpRow[], answer: OpsAnswer, gpu: boolean, search: HTMLInputElement): HTMLElement {
  const columns: Column<RunOpRow>[] = [
    { label: 'Op', value: (o) => o.name, cell: (o) => opName(o.name) },
  ];
  if (answer.group === 'shapes') {
    columns.push({
      label: 'Input shapes',
      value: (o) => o.shapes ?? '',
      cell: (o) => el('span', { class: 'shapes', title: o.shapes || 'not recorded' }, o.shapes || '–'),
    });
  }
  columns.push(
    { label: 'Calls', value: (o) => o.calls, cell: (o) => thousands(o.calls), numeric: true },
    { label: 'Self host ms', value: (o) => o.self_host_ms, cell: (o) => ms(o.self_host_ms), numeric: true, title: 'Own host time, without the ops it called' },
    { label: 'Host ms', value: (o) => o.host_ms, cell: (o) => ms(o.host_ms), numeric: true, title: 'Host time including the ops it called' },
  );
  if (gpu) {
    columns.push(
      { label: 'Self GPU ms', value: (o) => o.self_gpu_ms, cell: (o) => ms(o.self_gpu_ms), numeric: true, title: 'Device time of the work it launched itself' },
      { label: 'GPU ms', value: (o) => o.gpu_ms, cell: (o) => ms(o.gpu_ms), numeric: true, title: 'Device time launched within it' },
    );
  }
  columns.push(
    { label: 'Calls / step', value: (o) => o.calls_per_step, cell: (o) => count(o.calls_per_step), numeric: true },
    { label: 'Self host / step', value: (o) => o.self_host_ms_per_step, cell: (o) => ms(o.self_host_ms_per_step), numeric: true, title: 'Mean per profiled step, ms' },
    { label: 'Self host share', value: (o) => o.self_host_share, cell: (o) => pct(o.self_host_share), numeric: true, title: 'Of the steps’ host time' },
  );
  if (rows.some((o) => o.stack?.length)) columns.push(codeColumn<RunOpRow>());
  if (gpu) {
    columns.push({ label: 'Self GPU share', value: (o) => o.self_gpu_share, cell: (o) => pct(o.self_gpu_share), numeric: true, title: 'Of the steps’ kernel time (device time summed over streams)' });
  }
  columns.push(
    {
      label: 'Phases',
      value: (o) => o.phases.join(' '),
      cell: (o) => el('span', { class: 'phases', title: o.phases.join(', ') }, ...o.phases.map(swatch)),
      title: 'Where it ran, most host time first',
    },
    {
      label: 'Steps',
      value: (o) => o.steps.length,
      csv: (o) => o.steps.join(' '),
      numeric: true,
      title: 'The steps it ran in: open one',
      cell: (o) =>
        el(
          'span',
          { class: 'step-links' },
          ...o.steps.slice(0, STEPS_SHOWN).map((n) =>
            el('button', { type: 'button', class: 'link', title: `Open step ${n}`, onclick: () => ctx.go({ view: 'step', step: n }) }, String(n)),
          ),
          o.steps.length > STEPS_SHOWN ? el('span', { class: 'muted', title: o.steps.join(', ') }, ` +${o.steps.length - STEPS_SHOWN}`) : null,
        ),
    },
    {
      label: '',
      value: () => null,
      csv: () => null,
      cell: (o) =>
        el('button', { type: 'button', class: 'link', title: `${o.name} between two runs, workers or steps`, onclick: () => ctx.go({ view: 'compare', op: o.name }) }, 'Compare'),
    },
  );
  return table<RunOpRow>({
    label: answer.phase ? `Operators of ${answer.phase}` : 'Operators',
    rows,
    columns,
    sortBy: answer.group === 'shapes' ? 3 : 2, // self CPU, as key_averages() sorts
    descending: true,
    limit: 50,
    empty: 'No op matches.',
    tools: [search],
  });
}

function kernelsCard(ctx: ViewContext, worker: string): HTMLElement {
  const body = el('div');
  const out = card('Kernels over the profiled steps', body);
  void fetchInto(ctx, 'the kernels', () => ctx.api.kernels(ctx.state.run, worker, null, ctx.state.phase), body).then((answer) => {
    if (answer) replace(body, leftOutNote(answer), kernelsTable(ctx, answer.kernels, 25));
  });
  return out;
}
