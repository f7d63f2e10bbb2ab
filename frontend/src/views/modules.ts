/**
 * Which `nn.Module` takes the time: each module of the model (its path in the hierarchy, indented by
 * depth) with its forward and backward time, host and GPU, over every profiled step or one; sortable,
 * CSV. Click a module for its ops. The figures come from `PhaseProfiler(modules=True)`'s ranges or
 * from torch's module records of a `with_stack=True` trace (`/modules`).
 */

import { select } from '../components/controls';
import { card, figure, figures, leftOutNote } from '../components/layout';
import { opName } from '../components/ops_table';
import { notice } from '../components/status';
import { table, type Column } from '../components/table';
import { el, replace } from '../dom';
import { count, ms, thousands } from '../format';
import type { ModuleOp, ModuleRow, ModulesAnswer } from '../types';
import { fetchInto, overSteps, type View } from './view';

export const modules: View = overSteps({
  keys: ['run', 'worker'],
  nothing: 'no modules to show',
  async render(ctx, steps) {
    const { run } = ctx.state;
    const body = el('div', { class: 'view' });
    const content = el('div');
    let chosen: number | null = null;
    const draw = async () => {
      const answer = await fetchInto(ctx, `the modules of ${run}`, () => ctx.api.modules(run, steps.worker, chosen), content);
      if (answer) replace(content, ...moduleCards(answer));
    };
    const stepChoice = select(
      'Steps',
      [{ value: '', label: 'all profiled steps' }, ...steps.steps.map((s) => ({ value: String(s.step), label: `step ${s.step}` }))],
      '',
      (value) => {
        chosen = value === '' ? null : Number(value);
        void draw();
      },
    );
    replace(ctx.root, body);
    replace(body, el('div', { class: 'step-nav' }, stepChoice), content);
    await draw();
  },
});

function moduleCards(answer: ModulesAnswer): HTMLElement[] {
  if (!answer.modules.length) {
    return [
      notice(
        'No module was recorded. Profile with PhaseProfiler(modules=True) (a range around each module call of the attached ' +
          'model), or with_stack=True (torch’s own module records).',
      ),
    ];
  }
  const detail = el('div', { class: 'module-ops' });
  const top = answer.modules.filter((m) => m.parent === null);
  const forward = top.reduce((sum, m) => sum + m.forward_ms, 0);
  const show = (m: ModuleRow) => {
    replace(detail, card(`Ops of ${m.path}`, moduleOps(m, answer.has_gpu)));
    for (const tr of grid.querySelectorAll<HTMLElement>('tbody tr')) {
      tr.classList.toggle('selected', tr.querySelector('.module-name')?.textContent === m.path);
    }
  };
  const grid = modulesTable(answer, show);
  const scope = answer.step === null ? `${thousands(answer.steps)} profiled steps` : `step ${answer.step}`;
  return [
    figures(
      figure('Modules', thousands(answer.modules.length)),
      figure('Steps', answer.step === null ? thousands(answer.steps) : `step ${answer.step}`),
      figure('Forward phase', `${ms(answer.forward_phase_ms)} ms`, 'Host time of the steps’ forward phase'),
      figure('Top-level modules’ forward', `${ms(forward)} ms`, 'What the top-level modules’ calls add up to'),
      figure('From', answer.source),
    ),
    card(`Modules over ${scope}`, leftOutNote(answer), grid),
    detail,
  ];
}

function modulesTable(answer: ModulesAnswer, show: (m: ModuleRow) => void): HTMLElement {
  const columns: Column<ModuleRow>[] = [
    {
      label: 'Module',
      value: (m) => m.path,
      cell: (m) =>
        el(
          'button',
          { type: 'button', class: 'link module-name', style: `padding-left: ${m.depth * 1.2}em`, title: `${m.path}: show its ops` },
          m.path,
        ),
    },
    { label: 'Depth', value: (m) => m.depth, numeric: true, title: 'How many modules are around it' },
    { label: 'Calls', value: (m) => m.calls, cell: (m) => thousands(m.calls), numeric: true },
    {
      label: 'Fwd + bwd ms',
      value: (m) => m.forward_ms + m.backward_ms,
      cell: (m) => ms(m.forward_ms + m.backward_ms),
      numeric: true,
      title: 'Forward and backward host time, its children’s included',
    },
    { label: 'Forward ms', value: (m) => m.forward_ms, cell: (m) => ms(m.forward_ms), numeric: true, title: 'Host time of its calls, its children’s included' },
    { label: 'Self fwd ms', value: (m) => m.forward_self_ms, cell: (m) => ms(m.forward_self_ms), numeric: true, title: 'Forward host time without its children’s' },
    {
      label: 'Backward ms',
      value: (m) => m.backward_ms,
      cell: (m) => ms(m.backward_ms),
      numeric: true,
      title: 'Host time of its gradient functions (found through the autograd link), its children’s included',
    },
  ];
  if (answer.has_gpu) {
    columns.push(
      { label: 'Fwd GPU ms', value: (m) => m.forward_gpu_ms, cell: (m) => ms(m.forward_gpu_ms), numeric: true, title: 'Device time of the work launched in its calls' },
      { label: 'Bwd GPU ms', value: (m) => m.backward_gpu_ms, cell: (m) => ms(m.backward_gpu_ms), numeric: true, title: 'Device time its gradient functions launched' },
    );
  }
  columns.push(
    { label: 'Fwd / step', value: (m) => m.forward_ms_per_step, cell: (m) => ms(m.forward_ms_per_step), numeric: true, title: 'Mean per step, ms' },
    { label: 'Bwd / step', value: (m) => m.backward_ms_per_step, cell: (m) => ms(m.backward_ms_per_step), numeric: true, title: 'Mean per step, ms' },
  );
  const out = table<ModuleRow>({ label: 'Modules', rows: answer.modules, columns, limit: 100, onRowClick: show, empty: 'No module recorded.' });
  out.classList.add('modules-table');
  return out;
}

function moduleOps(m: ModuleRow, gpu: boolean): HTMLElement {
  const columns: Column<ModuleOp>[] = [
    { label: 'Op', value: (o) => o.name, cell: (o) => opName(o.name) },
    { label: 'Pass', value: (o) => (o.backward ? 'backward' : 'forward'), title: 'Forward op of the module, or gradient function of one' },
    { label: 'Calls', value: (o) => o.calls, cell: (o) => count(o.calls), numeric: true },
    { label: 'Host ms', value: (o) => o.host_ms, cell: (o) => ms(o.host_ms), numeric: true, title: 'Host time, the ops it called included' },
  ];
  if (gpu) columns.push({ label: 'GPU ms', value: (o) => o.gpu_ms, cell: (o) => ms(o.gpu_ms), numeric: true, title: 'Device time it launched' });
  return table<ModuleOp>({
    label: `Ops of ${m.path}`,
    rows: m.ops,
    columns,
    sortBy: 3,
    descending: true,
    limit: 50,
    empty: 'No op of its own: its time is in its children’s.',
  });
}
