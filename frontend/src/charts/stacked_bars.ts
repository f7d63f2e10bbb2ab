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
  /** Bars drawn but left out of the value axis's scale (warm-up and compiling steps): a bar taller
   *  than the others is cut at the axis's end, marked with a triangle and its total. */
  offScale?: (index: number) => boolean;
}

/** The value axis's end when some bars are off the scale: a little above the tallest other bar. */
function scaleEnd(bars: StackedBars): { max: number; cut: number[]; totals: number[] } | null {
  const offScale = bars.offScale;
  if (!offScale) return null;
  const totals = bars.categories.map((_, i) => bars.phases.reduce((sum, phase) => sum + bars.value(phase, i), 0));
  const kept = totals.filter((_, i) => !offScale(i));
  if (!kept.length) return null;
  // a round end (a half of a power of ten) a little above the tallest bar kept
  const top = Math.max(...kept) * 1.1;
  const half = 10 ** Math.floor(Math.log10(top || 1)) / 2;
  const max = Math.ceil(top / half) * half;
  const cut = totals.flatMap((t, i) => (offScale(i) && t > max ? [i] : []));
  return cut.length ? { max, cut, totals } : null;
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
  const scale = scaleEnd(bars);
  const end = scale ? { max: scale.max } : {};
  const valueAxis = bars.horizontal
    ? { type: 'value' as const, name: bars.valueName, nameLocation: 'middle' as const, nameGap: 22, ...end, ...axis }
    : {
        type: 'value' as const, name: bars.valueName, nameGap: 8, ...end, ...axis,
        // Above the axis, the name starts at the axis line: centred on it, its left half was cut.
        nameTextStyle: { ...axis.nameTextStyle, align: 'left' as const },
      };
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
  if (scale) {
    // a triangle at the axis's end over each bar cut there, with the bar's total (a line series of
    // markers only: no line between them)
    const cut = new Set(scale.cut);
    (option.series as unknown[]).push({
      type: 'line' as const,
      name: 'off the scale',
      symbol: 'triangle',
      symbolSize: 9,
      symbolRotate: bars.horizontal ? -90 : 0,
      showSymbol: true,
      lineStyle: { width: 0 },
      clip: false,
      silent: true,
      z: 5,
      tooltip: { show: false },
      itemStyle: { color: c.danger },
      label: {
        show: true,
        position: bars.horizontal ? 'right' : 'top',
        color: c.danger,
        fontSize: 10,
        formatter: (p: { dataIndex: number }) => `${Math.round(scale.totals[p.dataIndex]).toLocaleString('en-US')}`,
      },
      data: bars.categories.map((_, i) => (cut.has(i) ? scale.max : null)),
    });
  }
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
