/**
 * Tables of figures: sortable by any column, long ones cut to their first rows until asked, each
 * downloadable as CSV (every row, in the order shown, the values the columns sort by).
 */

import { append, el, replace, type Child } from '../dom';

export interface Column<T> {
  label: string;
  /** What the column sorts by. */
  value: (row: T) => number | string | null;
  /** What the cell shows (default: the value as text). */
  cell?: (row: T) => Child;
  numeric?: boolean;
  title?: string;
  /** What the CSV holds for the column (default: the sort value). */
  csv?: (row: T) => number | string | null;
}

export interface TableOptions<T> {
  columns: Column<T>[];
  rows: T[];
  /** Column to sort by at first, and whether largest first; unsorted (API order) by default. */
  sortBy?: number;
  descending?: boolean;
  limit?: number;
  onRowClick?: (row: T) => void;
  rowClass?: (row: T) => string;
  empty?: string;
  label?: string;
  /** Content shown in the table's header bar, before the CSV button (filters, counts). */
  tools?: Child[];
}

export function table<T>(options: TableOptions<T>): HTMLElement {
  const { columns, rows } = options;
  let sortBy = options.sortBy ?? -1;
  let descending = options.descending ?? true;
  let limit = options.limit ?? Infinity;
  const body = el('tbody');
  const more = el('div', { class: 'table-more' });
  const head = el('tr');

  const ordered = (): T[] => {
    if (sortBy < 0) return rows;
    const key = columns[sortBy].value;
    const sign = descending ? -1 : 1;
    return [...rows].sort((a, b) => {
      const x = key(a) ?? -Infinity;
      const y = key(b) ?? -Infinity;
      return x < y ? -sign : x > y ? sign : 0;
    });
  };

  const draw = () => {
    const shown = ordered().slice(0, limit);
    replace(
      body,
      ...shown.map((row) => {
        const tr = el('tr', { class: options.rowClass?.(row) ?? '' });
        for (const column of columns) {
          const content = column.cell ? column.cell(row) : column.value(row);
          append(tr, el('td', { class: column.numeric ? 'num' : '' }, content));
        }
        if (options.onRowClick) {
          tr.classList.add('clickable');
          tr.tabIndex = 0;
          tr.addEventListener('click', () => options.onRowClick?.(row));
          tr.addEventListener('keydown', (e) => e.key === 'Enter' && options.onRowClick?.(row));
        }
        return tr;
      }),
    );
    replace(
      more,
      rows.length > limit &&
        el(
          'button',
          { type: 'button', class: 'link', onclick: () => ((limit = Infinity), draw()) },
          `Show all ${rows.length} rows`,
        ),
    );
    head.querySelectorAll('th').forEach((th, i) => {
      th.setAttribute('aria-sort', i === sortBy ? (descending ? 'descending' : 'ascending') : 'none');
    });
  };

  columns.forEach((column, i) => {
    append(
      head,
      el(
        'th',
        {
          class: column.numeric ? 'num' : '',
          title: column.title ?? 'Sort by this column',
          onclick: () => {
            descending = sortBy === i ? !descending : Boolean(column.numeric);
            sortBy = i;
            draw();
          },
        },
        column.label,
      ),
    );
  });
  draw();
  if (!rows.length) return el('div', null, options.tools?.length ? el('div', { class: 'table-tools' }, ...options.tools) : null,
    el('div', { class: 'empty' }, options.empty ?? 'Nothing to show.'));
  const download = el('button', {
    type: 'button',
    class: 'link csv',
    title: 'Download every row of this table as CSV',
    onclick: () => saveFile(`${fileName(options.label ?? 'table')}.csv`, toCsv(columns, ordered()), 'text/csv'),
  }, 'CSV');
  return el(
    'div',
    { class: 'table-box' },
    el('div', { class: 'table-tools' }, ...(options.tools ?? []), download),
    el('table', { 'aria-label': options.label }, el('thead', null, head), body),
    more,
  );
}

/** RFC 4180 text of the rows: a header of the column labels, then each row's sort values. */
export function toCsv<T>(columns: Column<T>[], rows: T[]): string {
  const quote = (value: unknown) => {
    const text = value === null || value === undefined ? '' : String(value);
    return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
  };
  const lines = [columns.map((c) => quote(c.label)).join(',')];
  for (const row of rows) lines.push(columns.map((c) => quote(c.csv ? c.csv(row) : c.value(row))).join(','));
  return `${lines.join('\r\n')}\r\n`;
}

/** Let the browser save `text` as a file (no request leaves the page). */
export function saveFile(name: string, text: string, type: string): void {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = el('a', { href: url, download: name });
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 0);
}

function fileName(label: string): string {
  return label.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '') || 'table';
}
