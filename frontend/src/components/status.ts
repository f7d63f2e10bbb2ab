/** What a pane shows while it waits, when the API fails, or when there is nothing to show yet. */

import { ApiError } from '../api';
import { el, type Child } from '../dom';

export function loading(text: string): HTMLElement {
  return el('div', { class: 'status loading', role: 'status' }, el('span', { class: 'spinner' }), text);
}

export function failure(what: string, error: unknown): HTMLElement {
  const detail =
    error instanceof ApiError
      ? `${error.status ? `${error.status}: ` : ''}${error.message}`
      : error instanceof Error
        ? error.message
        : String(error);
  return el('div', { class: 'status error', role: 'alert' }, el('strong', null, `Could not load ${what}`), detail);
}

export function notice(...children: Child[]): HTMLElement {
  return el('div', { class: 'status notice' }, ...children);
}
