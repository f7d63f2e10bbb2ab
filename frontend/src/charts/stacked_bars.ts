/**
 * One stacked bar per category (a step, a rank, a side of a comparison), one segment per phase in
 * the phase's colour. A click anywhere in a bar's column picks it, however thin its segments.
 */

import { phaseColour } from '../phase_colours';
import { chartColours } from '../theme';
import { axisStyle, baseOption, type Chart, type ChartOption } from './echarts';

export interface StackedBars {
  categories: string[];
  phases: string[];
  value: (phase: string, index: number) => number;
  /** Which axis title the values get, e.g. "ms per step (CPU)". */
  valueName: string;
  horizontal?: boolean;
  /** Bars to call out (outlier steps, the straggler): their labels turn red. */
  flagged?: (index: number) => boolean;
  tooltip: (index: number) => HTMLElement;
  onPick?: (index: number) => void;
}

export function drawStackedBars(chart: Chart, bars: StackedBars): void {
  const c = chartColours();
  const flagged = bars.flagged ?? (() => false);
  const axis = axisStyle();
  const categoryAxis = {
    type: 'category' as const,
    data: bars.categories,
    inverse: bars.horizontal,
    ...axis,
    axisLabel: {
      ...axis.axisLabel,
      color: (_?: unknown, index?: number) => (flagged(index ?? -1) ? c.danger : c.subtle),
      fontWeight: 'normal' as const,
      hideOverlap: true,
    },
    axisTick: { ...axis.axisTick, alignWithLabel: true },
  };
  // Across the bottom when bars lie flat: at the axis end the name would run off the chart.
  const valueAxis = bars.horizontal
    ? { type: 'value' as const, name: bars.valueName, nameLocation: 'middle' as const, nameGap: 22, ...axis }
    : { type: 'value' as const, name: bars.valueName, nameGap: 8, ...axis };
  const option: ChartOption = {
    ...baseOption(),
    grid: bars.horizontal
      ? { left: 8, right: 24, top: 8, bottom: 24, containLabel: true }
      : { left: 8, right: 16, top: 28, bottom: 4, containLabel: true },
    xAxis: bars.horizontal ? valueAxis : categoryAxis,
    yAxis: bars.horizontal ? categoryAxis : valueAxis,
    tooltip: {
      ...baseOption().tooltip,
      trigger: 'axis',
      axisPointer: { type: 'shadow', shadowStyle: { color: c.shadow } },
      formatter: (params: unknown) => {
        const first = (Array.isArray(params) ? params[0] : params) as { dataIndex: number };
        return bars.tooltip(first.dataIndex);
      },
    },
    series: bars.phases.map((phase) => ({
      type: 'bar' as const,
      name: phase,
      stack: 'phases',
      barMaxWidth: 40,
      itemStyle: { color: phaseColour(phase) },
      emphasis: { disabled: true },
      data: bars.categories.map((_, i) => bars.value(phase, i)),
    })),
  };
  chart.setOption(option, true);

  const zr = chart.getZr();
  const pick = bars.onPick;
  if (!pick) return;
  const indexAt = (x: number, y: number): number | null => {
    if (!chart.containPixel({ gridIndex: 0 }, [x, y])) return null;
    const at = chart.convertFromPixel({ gridIndex: 0 }, [x, y]) as number[];
    const index = Math.round(bars.horizontal ? at[1] : at[0]);
    return index >= 0 && index < bars.categories.length ? index : null;
  };
  zr.on('click', (e) => {
    const index = indexAt(e.offsetX, e.offsetY);
    if (index !== null) pick(index);
  });
  zr.on('mousemove', (e) => zr.setCursorStyle(indexAt(e.offsetX, e.offsetY) === null ? 'default' : 'pointer'));
}
