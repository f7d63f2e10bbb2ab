/**
 * The Step Phases tab. TensorBoard loads this module into the tab's iframe and calls `render()`;
 * everything the tab needs (ECharts, its styles) is in this one file.
 */

import { App } from './app';
import styles from './styles.css';

export function render(): void {
  const style = document.createElement('style');
  style.textContent = styles;
  document.head.appendChild(style);
  document.body.classList.add('phaseprof');
  void new App(document.body).start();
}
