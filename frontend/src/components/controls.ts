/** The toolbar's inputs: labelled selects and segmented toggles. */

import { el } from '../dom';

export interface Choice {
  value: string;
  label: string;
  disabled?: boolean;
  title?: string;
}

export function select(label: string, choices: Choice[], value: string, onChange: (value: string) => void): HTMLElement {
  const input = el(
    'select',
    { 'aria-label': label, onchange: () => onChange(input.value) },
    ...choices.map((c) => el('option', { value: c.value, disabled: c.disabled, title: c.title }, c.label)),
  );
  input.value = value;
  return el('label', { class: 'field' }, el('span', { class: 'field-label' }, label), input);
}

export function segmented(label: string, choices: Choice[], value: string, onChange: (value: string) => void): HTMLElement {
  return el(
    'div',
    { class: 'segmented', role: 'radiogroup', 'aria-label': label },
    ...choices.map((c) =>
      el(
        'button',
        {
          type: 'button',
          role: 'radio',
          'aria-checked': String(c.value === value),
          class: c.value === value ? 'active' : '',
          disabled: c.disabled,
          title: c.title,
          onclick: () => c.value !== value && onChange(c.value),
        },
        c.label,
      ),
    ),
  );
}
