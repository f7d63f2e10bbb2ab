/**
 * A step's GPU time (or the mean step's) as a GPU engineer reads it: the four measures that split
 * the GPU window (compute, communication, memory, idle), each stream's launch queue and idle time
 * by what it waited for, the host calls that waited for the GPU, and the critical path with what
 * bounds it. Every figure is the answer's (`GpuTime`, `BlockingCall`, `CriticalPath`); the tab only
 * divides for widths and shares.
 */

import { el, type Child } from '../dom';
import { ms, pct } from '../format';
import type { BlockingCall, CriticalPath, GpuTime } from '../types';
import { kernelLabels } from './kernel_names';
import { badge, card, figure, figures, phaseName } from './layout';
import { opName } from './ops_table';
import { table, type Column } from './table';

/** The four measures, in the order they split the GPU window. */
export const MEASURES = ['compute', 'communication', 'memory', 'idle'] as const;
export type Measure = (typeof MEASURES)[number];

const MEASURE_LABELS: Record<Measure, string> = {
  compute: 'Compute',
  communication: 'Communication',
  memory: 'Memory',
  idle: 'Idle',
};

const MEASURE_HINTS: Record<Measure, string> = {
  compute: 'GPU busy time of kernels that are neither communication nor copies and sets',
  communication: 'GPU busy time of collectives (NCCL, RCCL, gloo); the bar shows the part '
    + 'with no compute beside it (exposed)',
  memory: 'GPU busy time of copies and sets (memcpy, memset); the bar shows the part with '
    + 'neither compute nor communication beside it (exposed)',
  idle: 'The GPU window (first to last activity of the work launched) with nothing running',
};

/** What each bound of a critical path means, in a sentence (CriticalPath.bound). */
const BOUNDS: Record<string, string> = {
  host: 'host work fills most of the path: the GPU waits for the host',
  'host-blocked': 'the host waiting for the GPU (a sync or blocking copy on the path) fills most',
  gpu: 'kernels fill most of the path: the step is GPU-bound',
  launch: 'launches of short kernels the GPU waited for fill most of it: launch-bound',
  communication: 'collectives fill most of the path',
  data: 'the data phase fills most of the path',
};

/** Kinds of path items that run on the GPU: their names are kernel names. */
const DEVICE_KINDS = new Set(['kernel', 'copy', 'collective']);

/** Each measure's part of the GPU window in the bar: exposed communication and memory only. */
function barParts(g: GpuTime): Record<Measure, number> {
  return {
    compute: g.compute_ms,
    communication: g.exposed_comm_ms,
    memory: g.exposed_memory_ms,
    idle: g.idle_ms,
  };
}

/** Each measure's whole time, and the part of it with nothing else running where that differs. */
function figureParts(g: GpuTime): Record<Measure, [number, number | null]> {
  return {
    compute: [g.compute_ms, null],
    communication: [g.comm_ms, g.exposed_comm_ms],
    memory: [g.memory_ms, g.exposed_memory_ms],
    idle: [g.idle_ms, null],
  };
}

/** Memory time per kind of copy or set, one line each, for a hover. */
function memoryKinds(g: GpuTime): string {
  const kinds = Object.entries(g.memory_kinds).map(([kind, t]) => `${kind}: ${ms(t)} ms`);
  return kinds.length ? kinds.join('\n') : 'No copies or sets';
}

function measureFigure(m: Measure, [total, exposed]: [number, number | null], hint: string) {
  return el(
    'div',
    { class: 'figure measure', 'data-measure': m, title: hint },
    el('div', { class: 'figure-label' },
      el('span', { class: `swatch measure-${m}` }), MEASURE_LABELS[m]),
    el('div', { class: 'figure-value' }, `${ms(total)} ms`,
      exposed === null ? null : el('span', { class: 'figure-sub' }, ` ${ms(exposed)} exposed`)),
  );
}

/** The four measures as figures over a bar of the GPU window split four ways. */
export function measuresCard(g: GpuTime, title: Child, extra?: Child): HTMLElement {
  const parts = barParts(g);
  const whole = MEASURES.reduce((sum, m) => sum + parts[m], 0);
  const kinds = memoryKinds(g);
  const totals = figureParts(g);
  const bar = el(
    'div',
    { class: 'measure-bar', role: 'img', 'aria-label': 'GPU window split into the four measures' },
    ...MEASURES.filter((m) => parts[m] > 0).map((m) => {
      const share = pct(whole ? parts[m] / whole : null);
      const hover = `${m}: ${ms(parts[m])} ms (${share} of the window)`
        + (m === 'memory' ? `\n${kinds}` : '');
      const part = el('div', { class: `measure-part measure-${m}`, 'data-measure': m,
        title: hover });
      part.style.flexGrow = String(parts[m]);
      return part;
    }),
  );
  return card(
    title,
    figures(...MEASURES.map((m) =>
      measureFigure(m, totals[m],
        m === 'memory' ? `${MEASURE_HINTS[m]}\n${kinds}` : MEASURE_HINTS[m]))),
    bar,
    el('p', { class: 'hint' },
      `The GPU window (${ms(g.window_ms)} ms, first to last activity of the work launched) split `,
      'four ways: compute, communication and memory where nothing else ran (exposed), idle. ',
      'Communication and copies running beside compute count in its part of the bar; the figures ',
      'give their whole time. Hover Memory for its kinds.'),
    extra,
  );
}

interface StreamRow {
  stream: string;
  busy: number;
  queueMean: number | null;
  queueMax: number | null;
  p50: number | null;
  p90: number | null;
  hostWait: number | null;
  kernelWait: number | null;
  other: number | null;
}

function streamRows(g: GpuTime): StreamRow[] {
  const split = g.idle_split ?? {};
  const names = [
    ...new Set([...Object.keys(g.streams), ...Object.keys(g.queues), ...Object.keys(split)]),
  ];
  return names.map((stream) => {
    const q = g.queues[stream];
    const idle = split[stream];
    return {
      stream,
      busy: g.streams[stream] ?? 0,
      queueMean: q?.mean ?? null,
      queueMax: q?.max ?? null,
      p50: q?.delay_p50_ms ?? null,
      p90: q?.delay_p90_ms ?? null,
      hostWait: idle?.host_wait_ms ?? null,
      kernelWait: idle?.kernel_wait_ms ?? null,
      other: idle?.other_ms ?? null,
    };
  });
}

type Get = (r: StreamRow) => number | null;

type Text = (v: number | null) => string;

function num(label: string, value: Get, text: Text, title: string): Column<StreamRow> {
  return { label, value, cell: (r) => text(value(r)), numeric: true, title };
}

const fixed2 = (v: number | null) => (v === null ? '–' : v.toFixed(2));
const whole = (v: number | null) => (v === null ? '–' : String(v));
const DELAY = 'Runtime call’s start to the device work’s start';

/** Per stream: busy time, launch queue and delay, and its idle time by what it waited for. */
export function streamsCard(g: GpuTime, title: Child): HTMLElement {
  const split = Object.keys(g.idle_split ?? {}).length > 0;
  const columns: Column<StreamRow>[] = [
    { label: 'Stream', value: (r) => r.stream },
    num('Busy ms', (r) => r.busy, ms, 'Device activity on the stream, an instant counted once'),
    num('Queue mean', (r) => r.queueMean, fixed2,
      'Work launched on the stream and not yet started, time-weighted mean over the host window'),
    num('Queue max', (r) => r.queueMax, whole, 'The most work waiting to start at once'),
    num('Launch delay p50 ms', (r) => r.p50, ms, `${DELAY}: median`),
    num('Launch delay p90 ms', (r) => r.p90, ms, `${DELAY}: 90th percentile`),
  ];
  if (split) {
    columns.push(
      num('Idle: host wait ms', (r) => r.hostWait, ms,
        'Idle with nothing queued: the host had not launched the next work'),
      num('Idle: kernel wait ms', (r) => r.kernelWait, ms, 'Short gaps between queued kernels'),
      num('Idle: other ms', (r) => r.other, ms,
        'Work queued behind another stream, an event or a longer stall'),
    );
  }
  return card(
    title,
    table<StreamRow>({ label: 'GPU streams', rows: streamRows(g), columns }),
    el('p', { class: 'hint' },
      'A long queue is a GPU with work waiting; a short one while the GPU idles, a host that does ',
      'not launch fast enough.',
      split ? ' Idle is the stream’s window less its busy time, split by what it waited for.' : ''),
  );
}

/** The host calls of a step that waited for the GPU: syncs and blocking copies, longest first. */
export function syncsCard(
  step: number,
  calls: BlockingCall[],
  opLink: (name: string) => HTMLElement,
): HTMLElement {
  const title = `Host calls waiting for the GPU in step ${step}`;
  if (!calls.length) {
    return card(title,
      el('p', { class: 'empty' },
        'None: no synchronize and no blocking copy to the host in this step.'));
  }
  const blocked = calls.reduce((sum, c) => sum + c.blocked_ms, 0);
  const code = calls.some((c) => c.frame);
  const waitedOn = (c: BlockingCall) =>
    (c.queue_stream && c.queued ? `most on ${c.queue_stream}` : '');
  const columns: Column<BlockingCall>[] = [
    {
      label: 'Call',
      value: (c) => c.call,
      cell: (c) => el('span', { class: 'sync-call' }, c.call,
        c.copy ? el('div', { class: 'muted' }, c.copy) : null),
      csv: (c) => (c.copy ? `${c.call} (${c.copy})` : c.call),
      title: 'The runtime call, and the copy it waited for (none: a synchronize)',
    },
    {
      label: 'Op',
      value: (c) => c.op,
      cell: (c) => (c.op
        ? el('span', null, opLink(c.op), c.inputs ? el('div', { class: 'shapes' }, c.inputs) : null)
        : '–'),
      title: 'The op that made it, with its input shapes',
    },
    ...(code
      ? [{
          label: 'Code',
          value: (c: BlockingCall) => c.frame,
          cell: (c: BlockingCall) =>
            (c.frame ? el('span', { class: 'file', title: c.frame }, c.frame) : '–'),
          title: 'Where the user’s code made it (with_stack=True)',
        }]
      : []),
    { label: 'Phase', value: (c) => c.phase, cell: (c) => phaseName(c.phase) },
    { label: 'Start ms', value: (c) => c.start_ms, cell: (c) => ms(c.start_ms), numeric: true,
      title: 'From the step’s start' },
    { label: 'Blocked ms', value: (c) => c.blocked_ms, cell: (c) => ms(c.blocked_ms), numeric: true,
      title: 'Host time the call held the host' },
    {
      label: 'Queued',
      value: (c) => c.queued,
      cell: (c) => el('span', { title: waitedOn(c) }, String(c.queued)),
      csv: (c) => (waitedOn(c) ? `${c.queued} (${waitedOn(c)})` : c.queued),
      numeric: true,
      title: 'Device work launched and not yet started when it began (all streams): what it '
        + 'waited behind; hover for the stream',
    },
  ];
  return card(
    title,
    el('p', { class: 'hint syncs-total' },
      `${calls.length} call${calls.length > 1 ? 's' : ''}, `,
      `${ms(blocked)} ms of host time blocked.`),
    table<BlockingCall>({ label: title, rows: calls, columns, sortBy: code ? 5 : 4, limit: 10 }),
  );
}

/** The critical path: its length and bound, its share per phase, and what is on it most. */
export function pathCard(p: CriticalPath, title: Child, extra?: Child): HTMLElement {
  const phases = Object.entries(p.phases).map(([phase, t]) => ({ phase, ms: t }));
  // kernel names shortened as the kernel tables shorten them (the full name on hover, in the CSV)
  const shown = kernelLabels(p.items.filter((i) => DEVICE_KINDS.has(i.kind)).map((i) => i.name));
  const ofPath = 'Of the path’s length';
  return card(
    title,
    figures(
      figure('Length', `${ms(p.length_ms)} ms`,
        'The longest chain of dependent work through the step: its wall time'),
      figure('Bound', el('span', { class: 'path-bound' }, p.bound), BOUNDS[p.bound] ?? p.bound),
    ),
    BOUNDS[p.bound] ? el('p', { class: 'hint' }, `Bound: ${BOUNDS[p.bound]}.`) : null,
    el('h4', null, 'By phase'),
    table({
      label: 'Critical path by phase',
      rows: phases,
      sortBy: 1,
      columns: [
        { label: 'Phase', value: (r) => r.phase, cell: (r) => phaseName(r.phase) },
        { label: 'On path ms', value: (r) => r.ms, cell: (r) => ms(r.ms), numeric: true },
        { label: 'Share', value: (r) => r.ms, numeric: true, title: ofPath,
          cell: (r) => pct(p.length_ms ? r.ms / p.length_ms : null) },
      ],
    }),
    el('h4', null, 'On the path, most time first'),
    table({
      label: 'Critical path items',
      rows: p.items,
      limit: 10,
      columns: [
        { label: 'Name', value: (r) => r.name, cell: (r) => opName(r.name, shown.get(r.name)) },
        { label: 'Kind', value: (r) => r.kind, cell: (r) => badge(r.kind, 'muted') },
        { label: 'On path ms', value: (r) => r.ms, cell: (r) => ms(r.ms), numeric: true },
        { label: 'Share', value: (r) => r.share, cell: (r) => pct(r.share), numeric: true,
          title: ofPath },
      ],
    }),
    extra,
  );
}
