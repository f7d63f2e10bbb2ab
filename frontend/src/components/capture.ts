/**
 * "Trace the next N steps" on the Timeline: asks a running run for a trace of its next steps
 * (`POST /capture`), follows the request until its new span is loaded in the tab, and lists the
 * run's captures, those the run took by itself on a slowdown with the step times that set it off.
 * A run that ended (or that this TensorBoard may not ask) gets the reason, not the button.
 */

import { ApiError } from '../api';
import { el, replace } from '../dom';
import { ms } from '../format';
import type { CaptureAnswer, CaptureInfo, RunsAnswer } from '../types';
import type { ViewContext } from '../views/view';
import { badge, button, card } from './layout';
import { failure } from './status';
import { table } from './table';

const BASE = new URL('./', import.meta.url);
/** How often a capture in progress is asked about again. */
const POLL_MS = 1000;
/** The header the route asks of a POST (a page of another origin cannot send it unasked). */
const ASK_HEADER = 'X-Phaseprof-Capture';

/** The request this page asked of each run, so a view drawn again keeps following it. */
const asked = new Map<string, string>();

const BY: Record<CaptureInfo['by'], string> = { cli: 'from the terminal', tab: 'from the tab', slowdown: 'on a slowdown' };

async function call(run: string, ask: number | null): Promise<CaptureAnswer> {
  const url = new URL('capture', BASE);
  url.searchParams.set('run', run);
  if (ask !== null) url.searchParams.set('steps', String(ask));
  const response = await fetch(url, ask === null ? { credentials: 'same-origin' } : {
    method: 'POST',
    credentials: 'same-origin',
    headers: { [ASK_HEADER]: 'ask' },
  });
  const body = await response.text();
  if (!response.ok) throw new ApiError(response.status, 'capture', body.trim() || `${response.status} ${response.statusText}`);
  return JSON.parse(body) as CaptureAnswer;
}

async function loadedSpans(): Promise<Map<string, { worker: string; ready: boolean }>> {
  const response = await fetch(new URL('runs', BASE), { credentials: 'same-origin' });
  const runs = (await response.json()) as RunsAnswer;
  const spans = new Map<string, { worker: string; ready: boolean }>();
  for (const run of runs.runs) {
    for (const w of run.workers) for (const s of w.spans) spans.set(`${run.run}/${s.file}`, { worker: w.worker, ready: s.state === 'ready' });
  }
  return spans;
}

function steps(first: number | null, last: number | null): string {
  if (first === null || last === null) return '–';
  return first === last ? `step ${first}` : `steps ${first}–${last}`;
}

function slowdownText(c: CaptureInfo): string {
  const why = c.why;
  if (!why) return '';
  const n = why.step_ms.length;
  const mean = why.step_ms.reduce((a, b) => a + b, 0) / Math.max(1, n);
  return `rank ${why.rank}: steps ${why.steps[0]}–${why.steps[n - 1]} took ${ms(mean)} ms on average, against ${ms(why.median_ms)} ± ${ms(why.band_ms)} ms before`;
}

/** A card that keeps itself up to date while the view lasts. */
export function captureCard(ctx: ViewContext, run: string): HTMLElement {
  const body = el('div', { class: 'capture' });
  const root = card('Trace the next steps', body);
  let timer: number | undefined;
  let chosen: number | null = null;
  ctx.scope.onDispose(() => window.clearTimeout(timer));

  const schedule = () => {
    window.clearTimeout(timer);
    timer = window.setTimeout(() => void refresh(null), POLL_MS);
  };

  const refresh = async (ask: number | null) => {
    let answer: CaptureAnswer;
    try {
      answer = await call(run, ask);
    } catch (error) {
      if (ctx.scope.live) replace(body, failure('the captures', error));
      return;
    }
    if (!ctx.scope.live) return;
    if (answer.asked) asked.set(run, answer.asked);
    const mine = answer.captures.find((c) => c.id === asked.get(run)) ?? null;
    const spans = mine?.state === 'written' || mine?.state === 'partial' ? await loadedSpans().catch(() => null) : null;
    if (!ctx.scope.live) return;
    draw(answer, mine, spans);
    const inProgress = answer.captures.some((c) => c.state === 'waiting' || c.state === 'tracing');
    const loadingSpan = mine !== null && spans !== null && !newSpan(mine, spans)?.ready;
    if (inProgress || loadingSpan) schedule();
  };

  const newSpan = (c: CaptureInfo, spans: Map<string, { worker: string; ready: boolean }>) => {
    const files = c.answers.flatMap((a) => a.files);
    const found = files.map((f) => spans.get(`${run}/${f}`));
    if (!files.length || found.some((s) => !s)) return null;
    return { worker: found[0]!.worker, ready: found.every((s) => s!.ready) };
  };

  const draw = (answer: CaptureAnswer, mine: CaptureInfo | null, spans: Map<string, { worker: string; ready: boolean }> | null) => {
    const max = answer.active ?? 10;
    const count = el('input', { type: 'number', min: 1, max, value: String(Math.min(chosen ?? max, max)), 'aria-label': 'Steps to trace', class: 'capture-steps' });
    const ask = button(`Trace the next ${count.value} steps`, () => {
      chosen = Math.max(1, Math.min(max, Number(count.value) || max));
      ask.disabled = true;
      void refresh(chosen);
    }, 'Ask the running job for a trace of its next steps, on every rank at the same step numbers');
    count.addEventListener('input', () => (ask.textContent = `Trace the next ${count.value} steps`));
    ask.disabled = !answer.can_ask;
    count.disabled = !answer.can_ask;
    replace(
      body,
      answer.can_ask
        ? el('p', null, `The run is running (step ${answer.step ?? '?'}): a capture traces up to ${max} steps from a step a moment ahead, on every rank.`)
        : el('p', { class: 'capture-reason', role: 'status' }, `Cannot trace this run now: ${answer.reason ?? 'unknown'}.`),
      el('div', { class: 'actions' }, count, ask),
      mine ? progress(mine, spans) : null,
      answer.captures.length
        ? capturesTable(answer.captures, (c) => {
            const written = c.answers.find((a) => a.state === 'written' && a.first !== null);
            if (written) void ctx.api.revalidate().then(() => ctx.go({ view: 'step', step: written.first }));
          })
        : el('p', { class: 'empty' }, 'No capture was asked of this run yet.'),
    );
  };

  const progress = (c: CaptureInfo, spans: Map<string, { worker: string; ready: boolean }> | null): HTMLElement => {
    const line = (text: string, ...more: (HTMLElement | null)[]) => el('p', { class: 'capture-progress', role: 'status' }, text, ...more);
    if (c.state === 'waiting' || c.state === 'tracing') {
      return line(`Asked for ${steps(c.first, c.last)}: ${c.state === 'tracing' ? 'tracing' : 'waiting for the run to reach them'}…`);
    }
    if (c.state === 'refused') return line(`Refused: ${c.answers.map((a) => `rank ${a.rank}: ${a.reason}`).join('; ')}`);
    const span = spans ? newSpan(c, spans) : null;
    const written = c.answers.find((a) => a.state === 'written');
    const first = written?.first ?? c.first;
    if (!span?.ready) return line(`Written: ${steps(written?.first ?? null, written?.last ?? null)}; loading the new span…`);
    return line(`New span: ${steps(written?.first ?? null, written?.last ?? null)}. `, button(`Open step ${first}`, () => {
      void ctx.api.revalidate().then(() => ctx.go({ view: 'step', worker: span.worker, step: first }));
    }));
  };

  void refresh(null);
  return root;
}

/** The run's captures; a click on a written one opens its first step. */
function capturesTable(captures: CaptureInfo[], open: (c: CaptureInfo) => void): HTMLElement {
  return table({
    label: 'Captures of this run',
    rows: captures,
    onRowClick: open,
    columns: [
      { label: 'Steps', value: (c) => c.first, cell: (c) => steps(c.first, c.last) },
      { label: 'Asked', value: (c) => c.written, cell: (c) => `${BY[c.by]}, ${new Date(c.written * 1000).toLocaleTimeString()}` },
      {
        label: 'State',
        value: (c) => c.state,
        cell: (c) => badge(c.state, c.state === 'written' ? '' : c.state === 'refused' || c.state === 'partial' ? 'danger' : 'muted',
          c.answers.map((a) => `rank ${a.rank}: ${a.state}${a.reason ? ` (${a.reason})` : ''}`).join('\n')),
      },
      { label: 'Why', value: (c) => (c.why ? 1 : 0), cell: (c) => slowdownText(c) || (c.answers.find((a) => a.reason)?.reason ?? '') },
    ],
  });
}
