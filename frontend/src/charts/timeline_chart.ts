/**
 * Every step of a run, phases stacked, fast at 50,000 steps: each series holds the running total
 * up to its phase and fills down to zero, the tallest drawn first, so the bands show each phase
 * without ECharts' own stacking; `max` sampling keeps the totals ordered and spikes visible.
 * Wheel zooms, the slider pans, a drag brushes a range of steps; profiled windows are shaded.
 * Time kept out of the steps (evaluation passes, the profiler's own time) is never stacked with the
 * phases: it has a grid of its own under them, on the same step axis (zoomed together), evaluation
 * as bars at the steps they preceded, the profiler's own time as a line.
 */

import { apartColour, apartLabel, type Apart } from '../apart';
import { phaseColour } from '../phase_colours';
import { chartColours } from '../theme';
import type { Series } from '../types';
import { axisStyle, baseOption, type Chart, type ChartOption } from './echarts';

export type StepRange = [number, number];

/** Grid heights (px) of the phases and, under them, of the time outside the steps. */
export const PHASES_HEIGHT = 250;
export const APART_HEIGHT = 110;
const TOP = 28;
const GAP = 34;
const BOTTOM = 44;
/** Fixed, not fitted to the labels: the two grids' step axes must line up. */
const LEFT = 64;

/** The chart's height, with or without the grid of time outside the steps. */
export function timelineHeight(withApart: boolean): number {
  return TOP + PHASES_HEIGHT + (withApart ? GAP + APART_HEIGHT : 0) + BOTTOM;
}

export interface TimelineChart {
  steps: number[];
  phases: string[];
  values: Record<string, Series>;
  valueName: string;
  /** Time outside the steps, drawn apart (empty: no such grid). */
  apart: { kind: Extract<Apart, 'eval' | 'profiler'>; values: Series }[];
  profiled: StepRange[];
  tooltip: (index: number) => HTMLElement;
  /** A brushed range of steps (first, last), or null when the brush is cleared. */
  onSelect: (range: StepRange | null) => void;
}

/** Running totals per phase; null where no phase has a value at that step (a gap, not a zero). */
export function runningTotals(steps: number[], phases: string[], values: Record<string, Series>): Series[] {
  const totals: Series[] = [];
  let below: Series = steps.map(() => null);
  for (const phase of phases) {
    const own = values[phase];
    const total: Series = new Array(steps.length);
    for (let i = 0; i < steps.length; i++) {
      const v = own ? own[i] : null;
      const b = below[i];
      total[i] = v === null ? b : (b ?? 0) + v;
    }
    totals.push(total);
    below = total;
  }
  return totals;
}

export function drawTimeline(chart: Chart, input: TimelineChart): void {
  const c = chartColours();
  const axis = axisStyle();
  const totals = runningTotals(input.steps, input.phases, input.values);
  const source: Record<string, (number | null)[]> = { step: input.steps };
  input.phases.forEach((phase, k) => (source[`total ${phase}`] = totals[k]));
  input.apart.forEach(({ kind, values }) => (source[kind] = values));
  const windows = input.profiled.map(([first, last]) => [{ xAxis: first - 0.5 }, { xAxis: last + 0.5 }]);
  const apart = input.apart.length > 0;
  const stepAxis = {
    type: 'value' as const,
    min: 'dataMin' as const,
    max: 'dataMax' as const,
    ...axis,
    splitLine: { show: false },
  };
  const xAxes = [0, 1].slice(0, apart ? 2 : 1).map((grid) => ({
    ...stepAxis,
    gridIndex: grid,
    // the step axis is named once, under the lowest grid
    ...(grid === (apart ? 1 : 0) ? { name: 'step', nameLocation: 'end' as const, nameGap: 4 } : {}),
  }));

  const option: ChartOption = {
    ...baseOption(),
    grid: [
      { left: LEFT, right: 36, top: TOP, height: PHASES_HEIGHT },
      ...(apart ? [{ left: LEFT, right: 36, top: TOP + PHASES_HEIGHT + GAP, height: APART_HEIGHT }] : []),
    ],
    dataset: { source, dimensions: Object.keys(source) },
    xAxis: xAxes,
    yAxis: [
      { type: 'value', gridIndex: 0, name: input.valueName, nameGap: 8, ...axis,
        // starts at the axis line: centred on it, its left half was cut
        nameTextStyle: { ...axis.nameTextStyle, align: 'left' } },
      ...(apart ? [{ type: 'value' as const, gridIndex: 1, name: 'ms outside the steps', nameGap: 8, ...axis }] : []),
    ],
    tooltip: {
      ...baseOption().tooltip,
      trigger: 'axis',
      axisPointer: { type: 'line', lineStyle: { color: c.axis }, link: [{ xAxisIndex: 'all' }] },
      formatter: (params: unknown) => input.tooltip((params as { dataIndex: number }[])[0].dataIndex),
    },
    dataZoom: [
      { type: 'inside', xAxisIndex: apart ? [0, 1] : 0, zoomOnMouseWheel: true, moveOnMouseMove: false, moveOnMouseWheel: false },
      {
        type: 'slider',
        xAxisIndex: apart ? [0, 1] : 0,
        height: 16,
        bottom: 6,
        showDataShadow: false,
        borderColor: c.axis,
        textStyle: { color: c.subtle, fontSize: 10 },
        labelFormatter: (value: number) => String(Math.round(value)),
      },
    ],
    brush: {
      xAxisIndex: 0,
      brushType: 'lineX',
      brushMode: 'single',
      transformable: true,
      throttleType: 'debounce',
      throttleDelay: 150,
      brushStyle: { color: c.brush, borderColor: c.axis, borderWidth: 1 },
      outOfBrush: { colorAlpha: 1 },
    },
    series: [
      // Tallest total first: each later (lower) total paints over it, leaving its phase's band.
      ...input.phases
        .map((phase) => ({
          type: 'line' as const,
          name: phase,
          encode: { x: 'step', y: `total ${phase}` },
          showSymbol: false,
          symbol: 'none',
          sampling: 'max' as const,
          lineStyle: { width: 0 },
          areaStyle: { color: phaseColour(phase), opacity: 1 },
          emphasis: { disabled: true },
          connectNulls: false,
        }))
        .reverse(),
      {
        type: 'line' as const,
        name: 'profiled',
        data: [],
        silent: true,
        markArea: {
          silent: true,
          itemStyle: { color: c.window, borderColor: c.windowBorder, borderWidth: 1 },
          label: { show: true, position: 'insideTop', color: c.subtle, fontSize: 10, formatter: 'profiled' },
          data: windows as never,
        },
      },
      ...input.apart.map(({ kind }) =>
        kind === 'eval'
          ? {
              type: 'bar' as const,
              name: apartLabel(kind),
              xAxisIndex: 1,
              yAxisIndex: 1,
              encode: { x: 'step', y: kind },
              barMinWidth: 2,
              barMaxWidth: 10,
              itemStyle: { color: apartColour(kind) },
              emphasis: { disabled: true },
            }
          : {
              type: 'line' as const,
              name: apartLabel(kind),
              xAxisIndex: 1,
              yAxisIndex: 1,
              encode: { x: 'step', y: kind },
              showSymbol: false,
              symbol: 'none',
              sampling: 'max' as const,
              lineStyle: { width: 1, color: apartColour(kind) },
              emphasis: { disabled: true },
              connectNulls: false,
            },
      ),
    ],
  };
  chart.setOption(option, true);
  chart.dispatchAction({ type: 'takeGlobalCursor', key: 'brush', brushOption: { brushType: 'lineX', brushMode: 'single' } });
  chart.on('brushEnd', (event: unknown) => {
    const area = (event as { areas: { coordRange: number[] }[] }).areas[0];
    input.onSelect(area ? stepsWithin(input.steps, area.coordRange[0], area.coordRange[1]) : null);
  });
}

/** The first and last recorded steps inside [x0, x1], or null when there are none. */
function stepsWithin(steps: number[], x0: number, x1: number): StepRange | null {
  const inside = steps.filter((s) => s >= x0 && s <= x1);
  return inside.length ? [inside[0], inside[inside.length - 1]] : null;
}

/** Draw `range` as the brushed one (a reload restores it), or clear the brush. */
export function showRange(chart: Chart, range: StepRange | null): void {
  chart.dispatchAction({
    type: 'brush',
    areas: range ? [{ brushType: 'lineX', xAxisIndex: 0, coordRange: [range[0] - 0.5, range[1] + 0.5] }] : [],
  });
}

export function zoomTo(chart: Chart, range: StepRange | null): void {
  chart.dispatchAction(
    range ? { type: 'dataZoom', startValue: range[0] - 0.5, endValue: range[1] + 0.5 } : { type: 'dataZoom', start: 0, end: 100 },
  );
}
