/** A table of ops: calls, self and total host time, GPU time, and input shapes where recorded. */

import { el } from '../dom';
import { count, ms } from '../format';
import type { OpFigures } from '../types';
import { table, type Column } from './table';

export interface OpsTableOptions {
  gpu: boolean;
  /** Rows shown before "Show all". */
  limit?: number;
  /** Ops of one step are aggregated by name and input shapes: show the shapes, where recorded. */
  shapes?: boolean;
}

export function opsTable(ops: OpFigures[], options: OpsTableOptions): HTMLElement {
  const columns: Column<OpFigures>[] = [
    { label: 'Op', value: (o) => o.name, cell: (o) => el('span', { class: 'op', title: o.name }, o.name) },
  ];
  if (options.shapes && ops.some((o) => o.shapes)) {
    columns.push({
      label: 'Input shapes',
      value: (o) => o.shapes ?? '',
      cell: (o) => el('span', { class: 'shapes', title: o.shapes ?? 'not recorded' }, o.shapes ?? '–'),
    });
  }
  columns.push(
    { label: 'Calls', value: (o) => o.calls, cell: (o) => count(o.calls), numeric: true },
    { label: 'Self CPU ms', value: (o) => o.self_cpu_ms, cell: (o) => ms(o.self_cpu_ms), numeric: true, title: 'Own host time, without the ops it called' },
    { label: 'CPU ms', value: (o) => o.cpu_ms, cell: (o) => ms(o.cpu_ms), numeric: true, title: 'Host time including the ops it called' },
  );
  if (options.gpu) {
    columns.push(
      { label: 'Self GPU ms', value: (o) => o.self_gpu_ms, cell: (o) => ms(o.self_gpu_ms), numeric: true, title: 'Device time of the kernels the op launched itself' },
      { label: 'GPU ms', value: (o) => o.gpu_ms, cell: (o) => ms(o.gpu_ms), numeric: true, title: 'Device time launched within the op' },
    );
  }
  return table({ label: 'Ops', rows: ops, columns, limit: options.limit, empty: 'No ops recorded.' });
}
