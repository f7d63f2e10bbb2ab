/**
 * The step trace view: a step's Chrome-trace document (the `/trace` answer) drawn as lanes — the
 * step's phases, each host thread with its ops nested by depth, each GPU stream with the work the
 * step launched, coloured by the phase that launched it. Wheel zooms around the pointer, drag pans,
 * double-click shows the whole step; hovering an event names it. Hovering or clicking (selecting) a
 * launch, a kernel or an op draws an arrow from each launch to the device work it launched (paired by
 * the `correlation` both carry, as the document's `ac2g` flow events pair them); a search box
 * highlights the events whose name holds its text; shift-drag brushes a time range, whose events are
 * counted and timed by name in a table.
 *
 * Drawn on one canvas by hand rather than by ECharts: a step holds up to tens of thousands of
 * events, and a canvas pass that skips what is off screen and merges what falls into one pixel
 * draws 50,000 of them in milliseconds (docs/frontend.md), which ECharts' custom series cannot.
 */

import { el, replace } from '../dom';
import { asApart, apartColour } from '../apart';
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
const APART_CATEGORY = 'apart';
const DEVICE_CATEGORIES = new Set(['kernel', 'gpu_memcpy', 'gpu_memset']);

/** One drawn event: times in µs from the step's start; where it is drawn (lane index, row). */
interface Box {
  start: number;
  end: number;
  event: TraceEvent;
  colour: string;
  lane: number;
  row: number;
}

/** At most this many flow arrows are drawn at once (an op can launch thousands of kernels). */
const MAX_FLOWS = 500;

interface Lane {
  label: string;
  /** Rows by depth; each row's boxes do not overlap and are in time order. */
  rows: Box[][];
  top: number;
  kind: 'phase' | 'host' | 'device';
}

export interface TraceLayout {
  /** The step's start on the trace's clock (µs): times in the layout are from it. */
  origin: number;
  lanes: Lane[];
  /** Launches (runtime calls) and device work by correlation. */
  launches: Map<number, Box>;
  work: Map<number, Box[]>;
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
    const kind = first.cat === PHASE_CATEGORY || first.cat === APART_CATEGORY ? 'phase' : DEVICE_CATEGORIES.has(first.cat ?? '') ? 'device' : 'host';
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
      (rows[depth] ??= []).push({ start, end, event: e, colour: colourOf(e), lane: 0, row: depth });
    }
    const label = names.get(key) ?? `thread ${first.tid}`;
    // a GPU stream is named with its device ("GPU 0 stream 7")
    lanes.push({ label: kind === 'device' ? `${processes.get(String(first.pid)) ?? ''} ${label}`.trim() : label, rows, top: 0, kind });
  }
  const weight = (lane: Lane) => lane.rows[0]?.reduce((sum, b) => sum + b.end - b.start, 0) ?? 0;
  const order = { phase: 0, host: 1, device: 2 };
  lanes.sort((a, b) => order[a.kind] - order[b.kind] || weight(b) - weight(a) || (a.label < b.label ? -1 : 1));
  let top = AXIS;
  const launches = new Map<number, Box>();
  const work = new Map<number, Box[]>();
  lanes.forEach((lane, index) => {
    lane.top = top;
    top += lane.rows.length * ROW + LANE_GAP;
    for (const row of lane.rows) {
      for (const b of row) {
        b.lane = index;
        const corr = b.event.args?.correlation;
        if (typeof corr !== 'number' || lane.kind === 'phase') continue;
        if (lane.kind === 'device') {
          const list = work.get(corr);
          if (list) list.push(b);
          else work.set(corr, [b]);
        } else launches.set(corr, b);
      }
    }
  });
  const events = lanes.reduce((n, lane) => n + lane.rows.reduce((m, row) => m + row.length, 0), 0);
  return { origin, lanes, launches, work, height: top, span, wall: doc.otherData.end_us - origin, events };
}

/** The launch -> device work pairs of an event: a kernel's own launch, a launch's work, or the work
 * of every launch inside an op (on its thread, within its time). */
export function flowsOf(layout: TraceLayout, b: Box | null): [Box, Box][] {
  if (!b) return [];
  const corr = b.event.args?.correlation;
  const kind = layout.lanes[b.lane]?.kind;
  if (kind === 'phase') return [];
  if (typeof corr === 'number') {
    if (kind === 'device') {
      const launch = layout.launches.get(corr);
      return launch ? [[launch, b]] : [];
    }
    return (layout.work.get(corr) ?? []).map((w) => [b, w]);
  }
  const out: [Box, Box][] = [];
  for (const row of layout.lanes[b.lane].rows.slice(b.row + 1)) {
    for (let i = firstEndingAfter(row, b.start); i < row.length && row[i].start < b.end && out.length < MAX_FLOWS; i++) {
      const c = row[i].event.args?.correlation;
      if (typeof c === 'number' && row[i].end <= b.end) for (const w of layout.work.get(c) ?? []) out.push([row[i], w]);
    }
  }
  return out;
}

/** One name's events in a time range: how many, their time inside the range and in all. */
export interface RangeRow {
  name: string;
  where: 'host' | 'GPU';
  count: number;
  in_range_us: number;
  total_us: number;
}

/** The events of host threads and GPU streams in [a, b) (µs from the step's start), by name: those
 * that overlap it, and instants inside it. Every event is looked at: work on one stream may overlap. */
export function rangeStats(layout: TraceLayout, a: number, b: number): RangeRow[] {
  const rows = new Map<string, RangeRow>();
  for (const lane of layout.lanes) {
    if (lane.kind === 'phase') continue;
    const where = lane.kind === 'device' ? 'GPU' : 'host';
    for (const row of lane.rows) {
      for (const box of row) {
        if (!(box.start < b && (box.end > a || box.start >= a))) continue;
        const key = `${where}\u0000${box.event.name}`;
        let r = rows.get(key);
        if (!r) rows.set(key, (r = { name: box.event.name, where, count: 0, in_range_us: 0, total_us: 0 }));
        r.count += 1;
        r.in_range_us += Math.max(Math.min(box.end, b) - Math.max(box.start, a), 0);
        r.total_us += box.end - box.start;
      }
    }
  }
  return [...rows.values()];
}

function colourOf(e: TraceEvent): string {
  const phase = e.args?.phase;
  if (typeof phase === 'string') return phaseColour(phase);
  const apart = asApart(e.args?.apart);
  return apart ? apartColour(apart) : '#9e9e9e';
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

/** Where the view's controls and what it tells go (outside the canvas's box). */
export interface TracePanels {
  /** The search box and its matches. */
  tools: HTMLElement;
  /** The selected event and its flows. */
  selection: HTMLElement;
  /** The statistics of a brushed range. */
  range: HTMLElement;
  /** Draws the range's table (the page's sortable, downloadable table). */
  rangeTable: (rows: RangeRow[]) => HTMLElement;
}

/** Draw `layout` into `box`; controls and what is selected go into `panels`. */
export function drawTrace(box: HTMLElement, layout: TraceLayout, scope: Scope, panels: TracePanels): void {
  const canvas = el('canvas', { class: 'trace-canvas', role: 'img', 'aria-label': `Trace of the step: ${layout.events} events` });
  const tip = el('div', { class: 'trace-tip', role: 'tooltip' });
  tip.hidden = true;
  replace(box, canvas, tip);
  box.style.height = `${layout.height}px`;
  const full: [number, number] = [Math.min(0, ...layout.lanes.flatMap((l) => (l.rows[0]?.length ? [l.rows[0][0].start] : []))), layout.span];
  let [t0, t1] = full;
  let width = 0;
  let frame = 0;
  let hovered: Box | null = null;
  let selected: Box | null = null;
  let query = '';
  let matches: Box[] = [];
  let matchAt = -1;
  let range: [number, number] | null = null;
  let brush: { from: number; to: number } | null = null;
  const all = layout.lanes.flatMap((lane) => lane.rows.flat());

  const x = (t: number) => GUTTER + ((t - t0) / (t1 - t0)) * (width - GUTTER);
  const timeAt = (px: number) => t0 + ((px - GUTTER) / (width - GUTTER)) * (t1 - t0);
  const middle = (b: Box) => layout.lanes[b.lane].top + b.row * ROW + ROW / 2;

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
    const shown = brush ? [Math.min(brush.from, brush.to), Math.max(brush.from, brush.to)] : range;
    if (shown) {
      ctx.fillStyle = colours.split;
      ctx.globalAlpha = 0.6;
      ctx.fillRect(Math.max(x(shown[0]), GUTTER), AXIS, Math.max(x(shown[1]) - Math.max(x(shown[0]), GUTTER), 1), layout.height - AXIS);
      ctx.globalAlpha = 1;
    }
    for (const lane of layout.lanes) {
      ctx.save();
      ctx.beginPath();
      ctx.rect(GUTTER, lane.top, width - GUTTER, lane.rows.length * ROW);
      ctx.clip();
      if (query) ctx.globalAlpha = 0.25; // what does not match fades; the matches are drawn again below
      lane.rows.forEach((row, depth) => paintRow(ctx, row, lane.top + depth * ROW));
      ctx.restore();
      ctx.fillStyle = colours.text;
      ctx.fillText(clipText(ctx, lane.label, GUTTER - 12), 4, lane.top + ROW / 2);
      ctx.fillStyle = colours.split;
      ctx.fillRect(0, lane.top + lane.rows.length * ROW + LANE_GAP / 2, width, 1);
    }
    ctx.save();
    ctx.beginPath();
    ctx.rect(GUTTER, AXIS, width - GUTTER, layout.height - AXIS);
    ctx.clip();
    let drawn = 0;
    for (const b of matches) {
      if (b.end < t0 || b.start > t1) continue;
      outline(ctx, b, b.colour, colours.text);
      drawn++;
    }
    if (selected) outline(ctx, selected, selected.colour, colours.danger);
    const flows = flowsOf(layout, selected ?? hovered).slice(0, MAX_FLOWS);
    for (const [from, to] of flows) arrow(ctx, x(from.start), middle(from), x(to.start), middle(to), colours.text);
    ctx.restore();
    canvas.dataset.flows = String(flows.length);
    canvas.dataset.highlighted = String(drawn);
  };

  const outline = (ctx: CanvasRenderingContext2D, b: Box, fill: string, stroke: string) => {
    const left = Math.max(x(b.start), GUTTER);
    const w = Math.max(x(b.end) - left, 2);
    const y = layout.lanes[b.lane].top + b.row * ROW;
    ctx.fillStyle = fill;
    ctx.fillRect(left, y + 1, w, ROW - 2);
    ctx.strokeStyle = stroke;
    ctx.lineWidth = 1.5;
    ctx.strokeRect(left, y + 1, w, ROW - 2);
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

  /** Select `b` (null: none) and say what it is and what it launched or was launched by. */
  const select = (b: Box | null) => {
    selected = b;
    const flows = flowsOf(layout, b);
    const when = (box: Box) => `${+(box.start / 1000).toFixed(4)} ms`;
    replace(
      panels.selection,
      b && el('span', null, el('strong', null, b.event.name), ` at ${when(b)}, ${+((b.event.dur ?? 0) / 1000).toFixed(4)} ms. `),
      b && (flows.length
        ? el('span', { class: 'trace-flows' }, layout.lanes[b.lane].kind === 'device'
          ? `Launched by ${flows[0][0].event.name} at ${when(flows[0][0])} on ${layout.lanes[flows[0][0].lane].label}.`
          : `Launches ${flows.length === 1 ? `${flows[0][1].event.name} on ${layout.lanes[flows[0][1].lane].label}` : `${flows.length} kernels, copies or sets`}.`)
        : el('span', { class: 'muted' }, 'No launch to or from it in this step.')),
      b && el('button', { type: 'button', class: 'link', onclick: () => select(null) }, 'Clear'),
    );
    redraw();
  };

  /** Show `b` in the middle of the view, zoomed in enough to see it. */
  const reveal = (b: Box) => {
    const span = Math.min(Math.max(t1 - t0, (b.end - b.start) * 4), full[1] - full[0]);
    t0 = Math.min(Math.max((b.start + b.end) / 2 - span / 2, full[0]), full[1] - span);
    t1 = t0 + span;
    select(b);
  };

  const search = el('input', { type: 'search', class: 'search trace-search', placeholder: 'Search events by name', 'aria-label': 'Search the trace' });
  const found = el('span', { class: 'muted trace-matches' });
  const next = el('button', { type: 'button', class: 'link', title: 'Select the next match and show it (Enter)' }, 'Next match');
  const find = () => {
    query = search.value.trim().toLowerCase();
    matches = query ? all.filter((b) => b.event.name.toLowerCase().includes(query)) : [];
    matches.sort((a, b) => a.start - b.start);
    matchAt = -1;
    replace(found, query ? `${matches.length} ${matches.length === 1 ? 'match' : 'matches'}` : '');
    next.hidden = !matches.length;
    redraw();
  };
  const step = () => {
    if (!matches.length) return;
    matchAt = (matchAt + 1) % matches.length;
    reveal(matches[matchAt]);
  };
  search.addEventListener('input', find);
  search.addEventListener('keydown', (e) => e.key === 'Enter' && step());
  next.addEventListener('click', step);
  next.hidden = true;
  const whole = el('button', { type: 'button', class: 'link', title: 'Count and time the events of the time shown, by name' }, 'Statistics of the view');
  whole.addEventListener('click', () => setRange([t0, t1]));
  replace(panels.tools, search, found, next, whole, el('span', { class: 'muted' }, 'Shift-drag to brush a time range.'));

  /** Count and time the events of [a, b) by name, under the trace. */
  const setRange = (r: [number, number] | null) => {
    range = r;
    redraw();
    if (!r) {
      replace(panels.range);
      delete panels.range.dataset.startUs;
      delete panels.range.dataset.endUs;
      return;
    }
    const [a, b] = r;
    const origin = layout.origin;
    panels.range.dataset.startUs = String(origin + a);
    panels.range.dataset.endUs = String(origin + b);
    const rows = rangeStats(layout, a, b);
    replace(
      panels.range,
      el('div', { class: 'trace-range-head' },
        el('strong', null, `From ${+(a / 1000).toFixed(4)} to ${+(b / 1000).toFixed(4)} ms`),
        ` (${+((b - a) / 1000).toFixed(4)} ms): ${rows.reduce((n, row) => n + row.count, 0)} events of ${rows.length} names. `,
        el('button', { type: 'button', class: 'link', onclick: () => setRange(null) }, 'Clear')),
      panels.rangeTable(rows),
    );
  };

  let drag: { x: number; t0: number; t1: number; moved: boolean } | null = null;
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
  canvas.addEventListener('mousedown', (e) => {
    const at = timeAt(e.clientX - canvas.getBoundingClientRect().left);
    if (e.shiftKey) brush = { from: at, to: at };
    else drag = { x: e.clientX, t0, t1, moved: false };
  });
  const move = (e: MouseEvent) => {
    if (brush) {
      brush.to = Math.min(Math.max(timeAt(e.clientX - canvas.getBoundingClientRect().left), full[0]), full[1]);
      redraw();
      return;
    }
    if (drag) {
      const dt = ((e.clientX - drag.x) / (width - GUTTER)) * (drag.t1 - drag.t0);
      drag.moved ||= Math.abs(e.clientX - drag.x) > 3;
      const span = drag.t1 - drag.t0;
      t0 = Math.min(Math.max(drag.t0 - dt, full[0]), full[1] - span);
      t1 = t0 + span;
      tip.hidden = true;
      redraw();
      return;
    }
    if (e.target !== canvas) return;
    const b = hit(e);
    if (b !== hovered) {
      hovered = b;
      redraw();
    }
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
  const up = (e: MouseEvent) => {
    if (brush) {
      const [a, b] = [Math.min(brush.from, brush.to), Math.max(brush.from, brush.to)];
      brush = null;
      if (b > a) setRange([a, b]);
      else redraw();
    } else if (drag && !drag.moved && e.target === canvas) select(hit(e));
    drag = null;
  };
  canvas.addEventListener('mousemove', move);
  canvas.addEventListener('mouseleave', () => {
    tip.hidden = true;
    if (hovered) {
      hovered = null;
      redraw();
    }
  });
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

/** A line from (x0, y0) to (x1, y1) with a head at its end. */
function arrow(ctx: CanvasRenderingContext2D, x0: number, y0: number, x1: number, y1: number, colour: string): void {
  const angle = Math.atan2(y1 - y0, x1 - x0);
  ctx.strokeStyle = colour;
  ctx.fillStyle = colour;
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(x0, y0);
  ctx.lineTo(x1, y1);
  ctx.stroke();
  ctx.beginPath();
  ctx.moveTo(x1, y1);
  ctx.lineTo(x1 - 7 * Math.cos(angle - 0.4), y1 - 7 * Math.sin(angle - 0.4));
  ctx.lineTo(x1 - 7 * Math.cos(angle + 0.4), y1 - 7 * Math.sin(angle + 0.4));
  ctx.closePath();
  ctx.fill();
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
    line('outside the step', args.apart),
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
