/** Tooltip contents as DOM (ECharts accepts elements): names from traces stay text. */

import { el, type Child } from '../dom';
import { swatch } from '../components/layout';
import { apartMark, type Apart } from '../apart';

export interface TooltipRow {
  phase?: string;
  /** Time kept out of the steps: its round mark instead of a phase's swatch. */
  apart?: Apart;
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
          el('td', null, r.phase ? swatch(r.phase) : r.apart ? apartMark(r.apart) : null, r.label),
          el('td', { class: 'num' }, r.value),
        ),
      ),
    ),
    footer ? el('div', { class: 'tip-footer' }, footer) : null,
  );
}
