/** Tooltip contents as DOM (ECharts accepts elements): names from traces stay text. */

import { el, type Child } from '../dom';
import { swatch } from '../components/layout';
import { outsideMark, type Outside } from '../outside';

export interface TooltipRow {
  phase?: string;
  /** Time kept out of the steps: its round mark instead of a phase's swatch. */
  outside?: Outside;
  label: string;
  value: string;
  strong?: boolean;
}

export function tooltipBody(title: Child, rows: TooltipRow[], footer?: Child): HTMLElement {
  return el(
    'div',
    { class: 'tip' },
    el('div', { class: 'tip-title' }, title),
    el(
      'table',
      null,
      ...rows.map((r) =>
        el(
          'tr',
          { class: r.strong ? 'strong' : '' },
          el('td', null, r.phase ? swatch(r.phase) : r.outside ? outsideMark(r.outside) : null, r.label),
          el('td', { class: 'num' }, r.value),
        ),
      ),
    ),
    footer ? el('div', { class: 'tip-footer' }, footer) : null,
  );
}
