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

/**
 * The steps a table over the profiled steps leaves out (warm-up, compiling, a step the trace cut),
 * and why, in a line; null for a table of one step or one that leaves none out.
 */
export function leftOutNote(answer: { step: number | null; left_out: number[]; left_out_why: string | null }): HTMLElement | null {
  if (answer.step !== null || !answer.left_out.length) return null;
  const n = answer.left_out.length;
  const why = answer.left_out_why ? ` (${answer.left_out_why})` : '';
  return el('p', { class: 'hint left-out' }, `Left out: step${n > 1 ? 's' : ''} ${answer.left_out.join(', ')}${why}.`);
}
