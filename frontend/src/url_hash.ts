/**
 * Where the tab keeps its selections, so that a reload keeps them.
 *
 * Inside TensorBoard the tab is an iframe whose own URL a reload resets, so the selections live in
 * TensorBoard's URL hash under the `p.phaseprof.<key>` names TensorBoard reserves for plugin data
 * (`#phaseprof&p.phaseprof.run=baseline`), beside TensorBoard's own entries. Opened on its own, the
 * tab uses its own hash.
 */

const PLUGIN_PREFIX = 'p.phaseprof.';

function hostWindow(): Window {
  try {
    if (window.parent !== window && window.parent.location.origin === window.location.origin) return window.parent;
  } catch {
    // A parent from another origin: keep to our own hash.
  }
  return window;
}

export class UrlHash {
  private readonly host = hostWindow();
  private readonly prefix = this.host === window ? '' : PLUGIN_PREFIX;

  read(): Record<string, string> {
    const out: Record<string, string> = {};
    for (const piece of this.pieces()) {
      const eq = piece.indexOf('=');
      if (eq < 0) continue;
      const key = decodeURIComponent(piece.slice(0, eq));
      if (key.startsWith(this.prefix)) out[key.slice(this.prefix.length)] = decodeURIComponent(piece.slice(eq + 1));
    }
    return out;
  }

  /** Replace our entries (the empty ones dropped), keeping the host's; `push`: as a new history
   * entry (Back returns to the one before), else in place. */
  write(values: Record<string, string>, push = false): void {
    const others = this.prefix ? this.pieces().filter((p) => !decodeURIComponent(p).startsWith(this.prefix)) : [];
    const ours = Object.entries(values)
      .filter(([, value]) => value !== '')
      .map(([key, value]) => `${encodeURIComponent(this.prefix + key)}=${encodeURIComponent(value)}`);
    const url = new URL(this.host.location.href);
    url.hash = [...others, ...ours].join('&');
    if (url.href === this.host.location.href) return;
    if (push) this.host.history.pushState(this.host.history.state, '', url.href);
    else this.host.history.replaceState(this.host.history.state, '', url.href);
  }

  /** The user edited the URL or went back or forward: `listener` reads the hash again. */
  onChange(listener: () => void): void {
    this.host.addEventListener('hashchange', listener);
    this.host.addEventListener('popstate', listener);
  }

  private pieces(): string[] {
    return this.host.location.hash.replace(/^#/, '').split('&').filter(Boolean);
  }
}
