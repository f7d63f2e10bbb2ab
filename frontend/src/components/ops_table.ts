/**
 * A table of ops: calls, self and total host time, GPU time, and input shapes where recorded.
 * Sorted by self time first (as `key_averages().table(sort_by="self_cpu_time_total")`): wrappers and
 * runtime calls that only contain others sink; every column sorts. Ops recorded with their input
 * shapes can be grouped by name alone or by name and shapes.
 */

import { el, replace } from '../dom';
import { count, ms } from '../format';
import type { OpFigures } from '../types';
import { segmented } from './controls';
import { table, type Column } from './table';

export interface OpsTableOptions {
  gpu: boolean;
  /** Rows shown before "Show all". */
  limit?: number;
  /** Ops of one step are aggregated by name and input shapes: show the shapes, where recorded. */
  shapes?: boolean;
  /** Sort by self GPU time first (ops of a GPU-bound phase) rather than self CPU time. */
  bySelfGpu?: boolean;
  /** The table's name (its CSV file is named after it). */
  label?: string;
  /** How an op's name shows (default: `opName`). */
  name?: (op: OpFigures) => HTMLElement;
}

/** An op's name (or `shown`, a shorter form of it), kept whole: in a narrow cell its middle gives
 * way, never its end; the full name on hover. */
export function opName(name: string, shown = name): HTMLElement {
  const keep = shown.length > 24 ? 14 : 0;
  return el(
    'span',
    { class: 'op', title: name },
    el('span', { class: 'op-head' }, keep ? shown.slice(0, -keep) : shown),
    keep ? el('span', { class: 'op-tail' }, shown.slice(-keep)) : null,
  );
}

/** Where in the user's code an op was called (`with_stack=True`): its innermost user frame, the whole
 * call stack (innermost first) on hover. */
export function codeCell(op: { frame?: string; stack?: string[] }): HTMLElement {
  if (!op.stack?.length) return el('span', { class: 'muted', title: 'No call stack: record with with_stack=True' }, '–');
  const shown = op.frame ?? op.stack[0];
  return el('span', { class: 'code-frame', title: op.stack.join('\n'), 'data-stack': String(op.stack.length) }, shown);
}

/** The column of `codeCell`, for tables whose rows carry a stack. */
export function codeColumn<T extends { frame?: string; stack?: string[] }>(): Column<T> {
  return {
    label: 'Code',
    value: (o) => o.frame ?? o.stack?.[0] ?? '',
    csv: (o) => (o.stack ?? []).join(' <- '),
    cell: (o) => codeCell(o),
    title: 'Where in your code it was called (the innermost frame of your own); the whole stack on hover',
  };
}

/** Ops of the same name added up (their shapes set aside). */
function byName(ops: OpFigures[]): OpFigures[] {
  const out = new Map<string, OpFigures>();
  for (const o of ops) {
    const seen = out.get(o.name);
    if (!seen) {
      out.set(o.name, { ...o, shapes: null });
      continue;
    }
    seen.calls += o.calls;
    seen.self_host_ms += o.self_host_ms;
    seen.host_ms += o.host_ms;
    seen.self_gpu_ms += o.self_gpu_ms;
    seen.gpu_ms += o.gpu_ms;
  }
  return [...out.values()];
}

export function opsTable(ops: OpFigures[], options: OpsTableOptions): HTMLElement {
  const shaped = Boolean(options.shapes && ops.some((o) => o.shapes));
  if (!shaped) return opsGrid(ops, options, false);
  const box = el('div', { class: 'ops-table' });
  const draw = (grouping: string) =>
    replace(
      box,
      segmented(
        'Group ops',
        [
          { value: 'shapes', label: 'Name + input shapes', title: 'One row per op name and input shapes' },
          { value: 'name', label: 'Name', title: 'One row per op name, all input shapes added up' },
        ],
        grouping,
        draw,
      ),
      grouping === 'name' ? opsGrid(byName(ops), options, false) : opsGrid(ops, options, true),
    );
  draw('shapes');
  return box;
}

function opsGrid(ops: OpFigures[], options: OpsTableOptions, shapes: boolean): HTMLElement {
  const columns: Column<OpFigures>[] = [{ label: 'Op', value: (o) => o.name, cell: (o) => options.name?.(o) ?? opName(o.name) }];
  if (shapes) {
    columns.push({
      label: 'Input shapes',
      value: (o) => o.shapes ?? '',
      cell: (o) => el('span', { class: 'shapes', title: o.shapes ?? 'not recorded' }, o.shapes ?? '–'),
    });
  }
  const selfColumn = columns.length + 1;
  const selfGpuColumn = columns.length + 3;
  columns.push(
    { label: 'Calls', value: (o) => o.calls, cell: (o) => count(o.calls), numeric: true },
    { label: 'Self host ms', value: (o) => o.self_host_ms, cell: (o) => ms(o.self_host_ms), numeric: true, title: 'Own host time, without the ops it called' },
    { label: 'Host ms', value: (o) => o.host_ms, cell: (o) => ms(o.host_ms), numeric: true, title: 'Host time including the ops it called' },
  );
  if (options.gpu) {
    columns.push(
      { label: 'Self GPU ms', value: (o) => o.self_gpu_ms, cell: (o) => ms(o.self_gpu_ms), numeric: true, title: 'Device time of the kernels the op launched itself' },
      { label: 'GPU ms', value: (o) => o.gpu_ms, cell: (o) => ms(o.gpu_ms), numeric: true, title: 'Device time launched within the op' },
    );
  }
  if (ops.some((o) => o.stack?.length)) columns.push(codeColumn<OpFigures>());
  return table({ label: options.label ?? 'Ops', rows: ops, columns, limit: options.limit, empty: 'No ops recorded.', sortBy: options.gpu && options.bySelfGpu ? selfGpuColumn : selfColumn, descending: true });
}
