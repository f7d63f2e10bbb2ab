/**
 * The step trace view: a step's Chrome-trace document (the `/trace` answer) drawn as lanes — the
 * step's phases, each host thread with its ops nested by depth, each GPU stream with the work the
 * step launched, coloured by the phase that launched it. Wheel zooms around the pointer, drag pans,
 * double-click shows the whole step; hovering an event names it.
 *
 * Drawn on one canvas by hand rather than by ECharts: a step holds up to tens of thousands of
 * events, and a canvas pass that skips what is off screen and merges what falls into one pixel
 * draws 50,000 of them in milliseconds (docs/frontend.md), which ECharts' custom series cannot.
 */

import { el, replace } from '../dom';
import { asOutside, outsideColour } from '../outside';
import { phaseColour } from '../phase_colours';
import type { Scope } from '../scope';
import { chartColours } from '../theme';
import type { StepTrace, TraceEvent } from '../types';

const ROW = 16;
const GUTTER = 170;
const AXIS = 22;
const LANE_GAP = 6;
const PHASE_CATEGORY = 'phase';
/** Time in the step's window kept out of the step, on the phase lane. */
const OUTSIDE_CATEGORY = 'outside';
const DEVICE_CATEGORIES = new Set(['kernel', 'gpu_memcpy', 'gpu_memset']);

/** One drawn event: times in µs from the step's start. */
interface Box {
  start: number;
  end: number;
  event: TraceEvent;
  colour: string;
}

interface Lane {
  label: string;
  /** Rows by depth; each row's boxes do not overlap and are in time order. */
  rows: Box[][];
  top: number;
  kind: 'phase' | 'host' | 'device';
}

export interface TraceLayout {
  lanes: Lane[];
  height: number;
  /** µs from the step's start to the end of its last event (device work may run past the step). */
  span: number;
  wall: number;
  events: number;
}

/** Lanes from the document: phases first, then host threads (busiest first), then GPU streams. */
export function layoutTrace(doc: StepTrace): TraceLayout {
  const origin = doc.otherData.start_us;
  const names = new Map<string, string>();
  const processes = new Map<string, string>();
  const byLane = new Map<string, TraceEvent[]>();
  for (const e of doc.traceEvents) {
    const key = `${e.pid}\u0000${e.tid}`;
    if (e.ph === 'M' && e.name === 'thread_name') names.set(key, String(e.args?.name ?? key));
    else if (e.ph === 'M' && e.name === 'process_name') processes.set(String(e.pid), String(e.args?.name ?? e.pid));
    else if (e.ph === 'X') {
      let list = byLane.get(key);
      if (!list) byLane.set(key, (list = []));
      list.push(e);
    }
  }
  const lanes: Lane[] = [];
  let span = doc.otherData.end_us - origin;
  for (const [key, events] of byLane) {
    const first = events[0];
    const kind = first.cat === PHASE_CATEGORY || first.cat === OUTSIDE_CATEGORY ? 'phase' : DEVICE_CATEGORIES.has(first.cat ?? '') ? 'device' : 'host';
    events.sort((a, b) => a.ts! - b.ts! || b.dur! - a.dur!);
    const rows: Box[][] = [];
    const open: number[] = []; // end of the innermost open event at each depth
    for (const e of events) {
      const start = e.ts! - origin;
      const end = start + (e.dur ?? 0);
      span = Math.max(span, end);
      while (open.length && open[open.length - 1] <= start) open.pop();
      const depth = kind === 'host' ? open.length : 0;
      if (kind === 'host') open.push(end);
      (rows[depth] ??= []).push({ start, end, event: e, colour: colourOf(e) });
    }
    const label = names.get(key) ?? `thread ${first.tid}`;
    // a GPU stream is named with its device ("GPU 0 stream 7")
    lanes.push({ label: kind === 'device' ? `${processes.get(String(first.pid)) ?? ''} ${label}`.trim() : label, rows, top: 0, kind });
  }
  const weight = (lane: Lane) => lane.rows[0]?.reduce((sum, b) => sum + b.end - b.start, 0) ?? 0;
  const order = { phase: 0, host: 1, device: 2 };
  lanes.sort((a, b) => order[a.kind] - order[b.kind] || weight(b) - weight(a) || (a.label < b.label ? -1 : 1));
  let top = AXIS;
  for (const lane of lanes) {
    lane.top = top;
    top += lane.rows.length * ROW + LANE_GAP;
  }
  const events = lanes.reduce((n, lane) => n + lane.rows.reduce((m, row) => m + row.length, 0), 0);
  return { lanes, height: top, span, wall: doc.otherData.end_us - origin, events };
}

function colourOf(e: TraceEvent): string {
  const phase = e.args?.phase;
  if (typeof phase === 'string') return phaseColour(phase);
  const outside = asOutside(e.args?.outside);
  return outside ? outsideColour(outside) : '#9e9e9e';
}

/** The first box of a row (in time order) that ends after `t`. */
function firstEndingAfter(row: Box[], t: number): number {
  let lo = 0;
  let hi = row.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (row[mid].end <= t) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Draw `layout` into `box`; returns the element holding the canvas and its tooltip. */
export function drawTrace(box: HTMLElement, layout: TraceLayout, scope: Scope): void {
  const canvas = el('canvas', { class: 'trace-canvas', role: 'img', 'aria-label': `Trace of the step: ${layout.events} events` });
  const tip = el('div', { class: 'trace-tip', role: 'tooltip' });
  tip.hidden = true;
  replace(box, canvas, tip);
  box.style.height = `${layout.height}px`;
  const full: [number, number] = [Math.min(0, ...layout.lanes.flatMap((l) => (l.rows[0]?.length ? [l.rows[0][0].start] : []))), layout.span];
  let [t0, t1] = full;
  let width = 0;
  let frame = 0;

  const x = (t: number) => GUTTER + ((t - t0) / (t1 - t0)) * (width - GUTTER);
  const timeAt = (px: number) => t0 + ((px - GUTTER) / (width - GUTTER)) * (t1 - t0);

  const paint = () => {
    frame = 0;
    width = box.clientWidth;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(layout.height * ratio);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${layout.height}px`;
    const ctx = canvas.getContext('2d')!;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const colours = chartColours();
    ctx.clearRect(0, 0, width, layout.height);
    ctx.font = '11px Roboto, sans-serif';
    ctx.textBaseline = 'middle';
    axis(ctx, colours.subtle, colours.split);
    for (const lane of layout.lanes) {
      ctx.save();
      ctx.beginPath();
      ctx.rect(GUTTER, lane.top, width - GUTTER, lane.rows.length * ROW);
      ctx.clip();
      lane.rows.forEach((row, depth) => paintRow(ctx, row, lane.top + depth * ROW));
      ctx.restore();
      ctx.fillStyle = colours.text;
      ctx.fillText(clipText(ctx, lane.label, GUTTER - 12), 4, lane.top + ROW / 2);
      ctx.fillStyle = colours.split;
      ctx.fillRect(0, lane.top + lane.rows.length * ROW + LANE_GAP / 2, width, 1);
    }
  };

  const paintRow = (ctx: CanvasRenderingContext2D, row: Box[], y: number) => {
    let lastPixel = -1;
    for (let i = firstEndingAfter(row, t0); i < row.length; i++) {
      const b = row[i];
      if (b.start > t1) break;
      const left = Math.max(x(b.start), GUTTER);
      const right = x(b.end);
      if (right < lastPixel + 0.5) continue; // inside a pixel already drawn
      const w = Math.max(right - left, 1);
      ctx.fillStyle = b.colour;
      ctx.fillRect(left, y + 1, w, ROW - 2);
      lastPixel = left + w;
      if (w > 36) {
        ctx.fillStyle = '#000000';
        ctx.fillText(clipText(ctx, b.event.name, w - 6), left + 3, y + ROW / 2);
      }
    }
  };

  const axis = (ctx: CanvasRenderingContext2D, text: string, grid: string) => {
    const step = niceStep((t1 - t0) / Math.max((width - GUTTER) / 110, 1));
    ctx.fillStyle = text;
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      const px = x(t);
      ctx.fillStyle = grid;
      ctx.fillRect(px, AXIS - 4, 1, layout.height - AXIS);
      ctx.fillStyle = text;
      ctx.fillText(`${+(t / 1000).toFixed(3)} ms`, px + 3, AXIS / 2);
    }
    const wall = x(layout.wall);
    if (wall > GUTTER && wall < width) {
      ctx.fillStyle = chartColours().danger;
      ctx.fillRect(wall, AXIS - 4, 1, layout.height - AXIS);
    }
  };

  const redraw = () => {
    if (!frame) frame = requestAnimationFrame(paint);
  };

  const hit = (event: MouseEvent): Box | null => {
    const rect = canvas.getBoundingClientRect();
    const px = event.clientX - rect.left;
    const py = event.clientY - rect.top;
    if (px < GUTTER) return null;
    const lane = layout.lanes.find((l) => py >= l.top && py < l.top + l.rows.length * ROW);
    if (!lane) return null;
    const row = lane.rows[Math.floor((py - lane.top) / ROW)];
    const t = timeAt(px);
    const slack = (t1 - t0) / (width - GUTTER); // one pixel
    const i = firstEndingAfter(row, t - slack);
    return i < row.length && row[i].start <= t + slack ? row[i] : null;
  };

  let drag: { x: number; t0: number; t1: number } | null = null;
  canvas.addEventListener('wheel', (e) => {
    e.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const at = timeAt(e.clientX - rect.left);
    const factor = Math.exp(e.deltaY * 0.002);
    const span = Math.min(Math.max((t1 - t0) * factor, 0.01), full[1] - full[0]);
    const share = (at - t0) / (t1 - t0);
    t0 = Math.max(full[0], at - share * span);
    t1 = Math.min(full[1], t0 + span);
    redraw();
  }, { passive: false });
  canvas.addEventListener('mousedown', (e) => (drag = { x: e.clientX, t0, t1 }));
  const move = (e: MouseEvent) => {
    if (drag) {
      const dt = ((e.clientX - drag.x) / (width - GUTTER)) * (drag.t1 - drag.t0);
      const span = drag.t1 - drag.t0;
      t0 = Math.min(Math.max(drag.t0 - dt, full[0]), full[1] - span);
      t1 = t0 + span;
      tip.hidden = true;
      redraw();
      return;
    }
    if (e.target !== canvas) return;
    const b = hit(e);
    if (!b) {
      tip.hidden = true;
      return;
    }
    showTip(tip, b);
    const rect = box.getBoundingClientRect();
    const left = Math.min(e.clientX - rect.left + 12, rect.width - tip.offsetWidth - 4);
    tip.style.left = `${Math.max(left, 0)}px`;
    tip.style.top = `${e.clientY - rect.top + 14}px`;
  };
  const up = () => (drag = null);
  canvas.addEventListener('mousemove', move);
  canvas.addEventListener('mouseleave', () => (tip.hidden = true));
  window.addEventListener('mousemove', move);
  window.addEventListener('mouseup', up);
  canvas.addEventListener('dblclick', () => {
    [t0, t1] = full;
    redraw();
  });
  const resize = new ResizeObserver(redraw);
  resize.observe(box);
  scope.onDispose(() => {
    resize.disconnect();
    window.removeEventListener('mousemove', move);
    window.removeEventListener('mouseup', up);
    if (frame) cancelAnimationFrame(frame);
  });
  paint();
}

function showTip(tip: HTMLElement, b: Box): void {
  const e = b.event;
  const args = e.args ?? {};
  const line = (label: string, value: unknown) =>
    value === undefined || value === null || value === '' ? null : el('div', null, el('span', { class: 'muted' }, `${label} `), String(value));
  replace(
    tip,
    el('strong', null, e.name),
    line('duration', `${+((e.dur ?? 0) / 1000).toFixed(4)} ms`),
    line('starts at', `${+(b.start / 1000).toFixed(4)} ms`),
    line('phase', args.phase),
    line('outside the step', args.outside),
    line('shapes', args['Input Dims'] !== undefined ? JSON.stringify(args['Input Dims']) : undefined),
    line('launched by', args['launched by']),
    line('category', e.cat),
    line('code', args.frame),
    Array.isArray(args.stack) ? el('div', { class: 'tip-stack' }, ...args.stack.slice(0, 16).map((f: unknown) => el('div', null, String(f)))) : null,
  );
  tip.hidden = false;
}

function clipText(ctx: CanvasRenderingContext2D, text: string, room: number): string {
  if (ctx.measureText(text).width <= room) return text;
  let lo = 0;
  let hi = text.length;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (ctx.measureText(`${text.slice(0, mid)}…`).width <= room) lo = mid;
    else hi = mid - 1;
  }
  return lo ? `${text.slice(0, lo)}…` : '';
}

function niceStep(raw: number): number {
  const power = 10 ** Math.floor(Math.log10(Math.max(raw, 1e-9)));
  const unit = raw / power;
  return (unit <= 1 ? 1 : unit <= 2 ? 2 : unit <= 5 ? 5 : 10) * power;
}
