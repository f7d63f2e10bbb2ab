/**
 * TensorBoard's light and dark looks. TensorBoard marks dark mode with a `dark-mode` class on its
 * page's body, which this same-origin iframe can watch; opened on its own, the tab follows the
 * system setting. Stylesheet colours switch on the `dark` class; charts ask `chartColours()`.
 */

export interface ChartColours {
  text: string;
  subtle: string;
  axis: string;
  split: string;
  tooltip: string;
  tooltipBorder: string;
  shadow: string;
  window: string;
  windowBorder: string;
  brush: string;
  danger: string;
  /** Time kept out of the steps (apart.ts): evaluation passes, paused blocks, the profiler's own. */
  evaluation: string;
  paused: string;
  profiler: string;
}

const LIGHT: ChartColours = {
  text: 'rgba(0, 0, 0, 0.87)',
  subtle: '#616161',
  axis: '#bdbdbd',
  split: '#eeeeee',
  tooltip: '#ffffff',
  tooltipBorder: '#e0e0e0',
  shadow: 'rgba(0, 0, 0, 0.06)',
  window: 'rgba(245, 124, 0, 0.08)',
  windowBorder: 'rgba(245, 124, 0, 0.5)',
  brush: 'rgba(66, 133, 244, 0.15)',
  danger: '#d32f2f',
  evaluation: '#6a1b9a',
  paused: '#455a64',
  profiler: '#bf360c',
};

const DARK: ChartColours = {
  text: '#ffffff',
  subtle: 'rgba(255, 255, 255, 0.7)',
  axis: '#757575',
  split: '#4a4a4a',
  tooltip: '#424242',
  tooltipBorder: '#616161',
  shadow: 'rgba(255, 255, 255, 0.06)',
  window: 'rgba(239, 108, 0, 0.14)',
  windowBorder: 'rgba(239, 108, 0, 0.6)',
  brush: 'rgba(138, 180, 248, 0.2)',
  danger: '#ef5350',
  evaluation: '#ce93d8',
  paused: '#b0bec5',
  profiler: '#ff8a65',
};

let dark = false;

export function chartColours(): ChartColours {
  return dark ? DARK : LIGHT;
}

/** Follow TensorBoard's (or the system's) dark mode; `onChange` runs after each switch. */
export function watchTheme(onChange: () => void): void {
  const apply = (next: boolean, notify: boolean) => {
    if (next === dark && notify) return;
    dark = next;
    document.documentElement.classList.toggle('dark', dark);
    if (notify) onChange();
  };
  const tensorBoardBody = parentBody();
  if (tensorBoardBody) {
    const read = () => tensorBoardBody.classList.contains('dark-mode');
    apply(read(), false);
    new MutationObserver(() => apply(read(), true)).observe(tensorBoardBody, {
      attributes: true,
      attributeFilter: ['class'],
    });
    return;
  }
  const media = window.matchMedia('(prefers-color-scheme: dark)');
  apply(media.matches, false);
  media.addEventListener('change', () => apply(media.matches, true));
}

function parentBody(): HTMLElement | null {
  try {
    return window.parent !== window ? window.parent.document.body : null;
  } catch {
    return null; // a parent from another origin
  }
}
