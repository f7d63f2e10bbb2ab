/** The building blocks every view is made of: cards, figures, headings, legends. */

import { el, type Child } from '../dom';
import { phaseColour } from '../phase_colours';

export function card(title: Child, ...children: Child[]): HTMLElement {
  return el('section', { class: 'card' }, el('h3', null, title), ...children);
}

/** A headline figure: `label` above `value`. */
export function figure(label: string, value: Child, hint?: string): HTMLElement {
  return el('div', { class: 'figure', title: hint }, el('div', { class: 'figure-label' }, label), el('div', { class: 'figure-value' }, value));
}

export function figures(...items: Child[]): HTMLElement {
  return el('div', { class: 'figures' }, ...items);
}

export function swatch(phase: string): HTMLElement {
  const node = el('span', { class: 'swatch' });
  node.style.background = phaseColour(phase);
  return node;
}

/** A phase name with its colour. */
export function phaseName(phase: string): HTMLElement {
  return el('span', { class: 'phase' }, swatch(phase), phase);
}

export function legend(phases: string[]): HTMLElement {
  return el('div', { class: 'legend' }, ...phases.map(phaseName));
}

export function chartBox(height: number): HTMLElement {
  const node = el('div', { class: 'chart' });
  node.style.height = `${height}px`;
  return node;
}

export function button(label: string, onClick: () => void, title?: string): HTMLButtonElement {
  return el('button', { type: 'button', class: 'button', title, onclick: onClick }, label);
}

export function badge(text: string, kind: string, title?: string): HTMLElement {
  return el('span', { class: `badge ${kind}`, title }, text);
}
