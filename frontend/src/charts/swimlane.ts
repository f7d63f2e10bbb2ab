/**
 * One step as swimlanes: the loop's thread with its phase segments, the process's other threads,
 * then each GPU stream, every band coloured by the phase it belongs to (or that launched it). Time
 * in the step's window kept out of the step lies on the loop's lane in its own colour, thinner than
 * a phase's band. The step's critical path, where given, is a line over the bands it runs through,
 * joined from lane to lane where it moves (host to a stream at a launch, back at a sync).
 */

import { graphic } from 'echarts/core';

import { ms } from '../format';
import { asApart, apartColour, apartLabel, type Apart } from '../apart';
import { phaseColour } from '../phase_colours';
import type { Band, ApartBand, PathSegment } from '../types';
import { chartColours } from '../theme';
import { axisStyle, baseOption, stepTimeAxis, type Chart, type ChartOption } from './echarts';
import { tooltipBody } from './tooltip';

export interface Swimlanes {
  labels: string[];
  bands: Band[];
  /** Stretches of the window kept out of the step: drawn on lane 0, apart from the phases. */
  apart: ApartBand[];
  /** The step's window (its own time and what was kept out of it). */
  wallMs: number;
  /** The critical path's stretches; lane `host` is the loop's thread (lane 0). */
  path?: PathSegment[];
}

/** A critical path's stretch on its lane (`host`: the loop's thread). */
interface PathMark {
  value: number[];
  segment: PathSegment;
  /** Lane and end of the stretch before, where the path moved from another lane. */
  from?: number[];
}

/** The path's stretches placed on the lanes; stretches on a lane not drawn are left out. */
export function placePath(labels: string[], path: PathSegment[]): PathMark[] {
  const out: PathMark[] = [];
  for (const segment of path) {
    const lane = segment.lane === 'host' ? 0 : labels.indexOf(segment.lane);
    if (lane < 0) continue;
    const before = out[out.length - 1];
    const moved = before && before.value[0] !== lane;
    const from = moved ? [before.value[0], before.value[2]] : undefined;
    out.push({ value: [lane, segment.start_ms, segment.end_ms], segment, from });
  }
  return out;
}

export const LANE_HEIGHT = 22;

export function drawSwimlanes(chart: Chart, lanes: Swimlanes): void {
  const axis = axisStyle();
  const data: { value: number[]; phase?: string; apart?: Apart }[] = [
    ...lanes.bands.map(([lane, start, end, phase]) => ({ value: [lane, start, end], phase })),
    ...lanes.apart.map(([start, end, kind]) => ({ value: [0, start, end], apart: asApart(kind) ?? undefined })),
  ];
  const path = placePath(lanes.labels, lanes.path ?? []);
  const pathColour = chartColours().text;
  const option: ChartOption = {
    ...baseOption(),
    grid: { left: 8, right: 16, top: 24, bottom: 40, containLabel: true },
    xAxis: {
      ...stepTimeAxis(lanes.wallMs),
      // The axis ends at the step's wall time: keep its label as short as the others.
      axisLabel: { ...axis.axisLabel, formatter: (value: number) => String(Math.round(value * 10) / 10) },
    },
    yAxis: {
      type: 'category',
      data: lanes.labels,
      inverse: true,
      ...axis,
      splitLine: { show: true, lineStyle: axis.splitLine.lineStyle },
      axisLabel: { ...axis.axisLabel, width: 220, overflow: 'truncate' },
    },
    tooltip: {
      ...baseOption().tooltip,
      trigger: 'item',
      formatter: (params: unknown) => {
        const { dataIndex, seriesIndex } = params as { dataIndex: number; seriesIndex: number };
        if (seriesIndex === 1) {
          const { segment: p } = path[dataIndex];
          return tooltipBody(`Critical path: ${p.name}`, [
            { label: p.kind, value: `${ms(p.end_ms - p.start_ms)} ms`, strong: true },
            { label: 'on', value: p.lane },
            { label: 'from', value: `${ms(p.start_ms)} ms` },
            { label: 'to', value: `${ms(p.end_ms)} ms` },
          ]);
        }
        const { value: [lane, start, end], phase, apart } = data[dataIndex];
        return tooltipBody(lanes.labels[lane], [
          apart
            ? { apart, label: apartLabel(apart), value: `${ms(end - start)} ms`, strong: true }
            : { phase, label: phase ?? '', value: `${ms(end - start)} ms`, strong: true },
          { label: 'from', value: `${ms(start)} ms` },
          { label: 'to', value: `${ms(end)} ms` },
        ]);
      },
    },
    dataZoom: [{ type: 'inside', xAxisIndex: 0, filterMode: 'weakFilter' }],
    series: [
      {
        type: 'custom',
        encode: { x: [1, 2], y: 0 },
        data,
        clip: true,
        renderItem: (params, api) => {
          const lane = api.value(0);
          const from = api.coord([api.value(1), lane]);
          const to = api.coord([api.value(2), lane]);
          const { phase, apart } = data[params.dataIndex];
          const height = (api.size?.([0, 1]) as number[])[1] * (apart ? 0.3 : 0.7);
          const rect = graphic.clipRectByRect(
            { x: from[0], y: from[1] - height / 2, width: Math.max(to[0] - from[0], 1), height },
            params.coordSys as unknown as { x: number; y: number; width: number; height: number },
          );
          return rect && { type: 'rect', shape: rect, style: { fill: apart ? apartColour(apart) : phaseColour(phase ?? '') } };
        },
      },
      {
        type: 'custom',
        name: 'critical path',
        encode: { x: [1, 2], y: 0 },
        data: path.map((p) => p.value),
        clip: true,
        z: 3,
        renderItem: (params, api) => {
          const lane = api.value(0);
          const from = api.coord([api.value(1), lane]);
          const to = api.coord([api.value(2), lane]);
          const { from: before } = path[params.dataIndex];
          const line = { stroke: pathColour, lineWidth: 1, lineDash: [3, 2] };
          const width = Math.max(to[0] - from[0], 2);
          return {
            type: 'group',
            children: [
              {
                type: 'rect',
                shape: { x: from[0], y: from[1] - 1.5, width, height: 3 },
                style: { fill: pathColour },
              },
              ...(before
                ? [{ type: 'line' as const, style: line,
                    shape: lineFrom(api.coord([before[1], before[0]]), from) }]
                : []),
            ],
          };
        },
      },
    ],
  };
  chart.setOption(option, true);
}

function lineFrom(a: number[], b: number[]) {
  return { x1: a[0], y1: a[1], x2: b[0], y2: b[1] };
}
