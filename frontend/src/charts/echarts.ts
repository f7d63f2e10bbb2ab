/**
 * ECharts, tree-shaken to what the tab draws: bars, lines, swimlane rectangles on a canvas, with
 * tooltips, zoom, brushing and marked areas. Every chart follows the current light or dark look.
 */

import type { BarSeriesOption, CustomSeriesOption, LineSeriesOption } from 'echarts/charts';
import { BarChart, CustomChart, LineChart } from 'echarts/charts';
import type {
  BrushComponentOption,
  DataZoomComponentOption,
  DatasetComponentOption,
  GridComponentOption,
  MarkAreaComponentOption,
  TooltipComponentOption,
} from 'echarts/components';
import {
  BrushComponent,
  DatasetComponent,
  DataZoomInsideComponent,
  DataZoomSliderComponent,
  GridComponent,
  MarkAreaComponent,
  TooltipComponent,
} from 'echarts/components';
import { init, use, type ComposeOption, type EChartsType } from 'echarts/core';
import { CanvasRenderer } from 'echarts/renderers';

import type { Scope } from '../scope';
import { chartColours } from '../theme';

use([
  BarChart,
  LineChart,
  CustomChart,
  GridComponent,
  TooltipComponent,
  DataZoomInsideComponent,
  DataZoomSliderComponent,
  BrushComponent,
  DatasetComponent,
  MarkAreaComponent,
  CanvasRenderer,
]);

export type ChartOption = ComposeOption<
  | BarSeriesOption
  | LineSeriesOption
  | CustomSeriesOption
  | GridComponentOption
  | TooltipComponentOption
  | DataZoomComponentOption
  | DatasetComponentOption
  | BrushComponentOption
  | MarkAreaComponentOption
>;

export type Chart = EChartsType;

export const FONT = 'Roboto, "Helvetica Neue", Arial, sans-serif';

/** A chart in `box`, resized with it and disposed with the view. */
export function mountChart(box: HTMLElement, scope: Scope): Chart {
  const chart = init(box, null, { renderer: 'canvas' });
  const resize = new ResizeObserver(() => chart.resize());
  resize.observe(box);
  scope.onDispose(() => {
    resize.disconnect();
    chart.dispose();
  });
  return chart;
}

/** What every chart shares: no animation (numbers, not motion), the theme's text and tooltips. */
export function baseOption(): ChartOption {
  const c = chartColours();
  return {
    animation: false,
    textStyle: { fontFamily: FONT, fontSize: 12, color: c.text },
    tooltip: {
      backgroundColor: c.tooltip,
      borderColor: c.tooltipBorder,
      textStyle: { color: c.text, fontSize: 12, fontFamily: FONT },
      confine: true,
      transitionDuration: 0,
      extraCssText: 'box-shadow: 0 2px 6px rgba(0,0,0,.25); border-radius: 4px;',
    },
  };
}

export function axisStyle() {
  const c = chartColours();
  return {
    axisLine: { lineStyle: { color: c.axis } },
    axisTick: { lineStyle: { color: c.axis } },
    axisLabel: { color: c.subtle, fontSize: 11 },
    splitLine: { lineStyle: { color: c.split } },
    nameTextStyle: { color: c.subtle, fontSize: 11 },
  };
}

/**
 * The x axis of a chart over one step: ms from its start, to at least `endMs` (the step's wall
 * time, and any time kept apart in it) however little is drawn.
 */
export function stepTimeAxis(endMs: number) {
  return {
    type: 'value' as const,
    min: 0,
    max: (extent: { max: number }) => Math.max(extent.max, endMs),
    name: 'ms from step start',
    nameLocation: 'middle' as const,
    nameGap: 22,
    ...axisStyle(),
  };
}
