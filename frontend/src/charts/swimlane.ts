/**
 * One step as swimlanes: the loop's thread with its phase segments, the process's other threads,
 * then each GPU stream, every band coloured by the phase it belongs to (or that launched it). Time
 * in the step's window kept out of the step lies on the loop's lane in its own colour, thinner than
 * a phase's band.
 */

import { graphic } from 'echarts/core';

import { ms } from '../format';
import { asApart, apartColour, apartLabel, type Apart } from '../apart';
import { phaseColour } from '../phase_colours';
import type { Band, ApartBand } from '../types';
import { axisStyle, baseOption, type Chart, type ChartOption } from './echarts';
import { tooltipBody } from './tooltip';

export interface Swimlanes {
  labels: string[];
  bands: Band[];
  /** Stretches of the window kept out of the step: drawn on lane 0, apart from the phases. */
  apart: ApartBand[];
  /** The step's window (its own time and what was kept out of it). */
  wallMs: number;
}

export const LANE_HEIGHT = 22;

export function drawSwimlanes(chart: Chart, lanes: Swimlanes): void {
  const axis = axisStyle();
  const data: { value: number[]; phase?: string; apart?: Apart }[] = [
    ...lanes.bands.map(([lane, start, end, phase]) => ({ value: [lane, start, end], phase })),
    ...lanes.apart.map(([start, end, kind]) => ({ value: [0, start, end], apart: asApart(kind) ?? undefined })),
  ];
  const option: ChartOption = {
    ...baseOption(),
    grid: { left: 8, right: 16, top: 24, bottom: 40, containLabel: true },
    xAxis: {
      type: 'value',
      min: 0,
      max: (extent: { max: number }) => Math.max(extent.max, lanes.wallMs),
      name: 'ms from step start',
      nameLocation: 'middle',
      nameGap: 22,
      ...axis,
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
        const { dataIndex } = params as { dataIndex: number };
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
    ],
  };
  chart.setOption(option, true);
}
