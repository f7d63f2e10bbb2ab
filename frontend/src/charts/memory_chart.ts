/**
 * Memory over one step: allocated (and reserved) bytes per device as steps after each memory event,
 * the phases of the loop's thread shaded beneath, the peak marked. Time in the window kept out of
 * the step is shaded in its own colour; its memory events are not the step's and are not drawn.
 */

import { bytes, ms } from '../format';
import { asApart, apartColour, apartLabel } from '../apart';
import { phaseColour } from '../phase_colours';
import { chartColours } from '../theme';
import type { MemoryAnswer } from '../types';
import { axisStyle, baseOption, stepTimeAxis, type Chart, type ChartOption } from './echarts';
import { tooltipBody } from './tooltip';

const DEVICE_COLOURS = ['#5c6bc0', '#ef5350', '#26a69a', '#8d6e63'];

export function drawMemory(chart: Chart, answer: MemoryAnswer): void {
  const axis = axisStyle();
  const c = chartColours();
  const series: NonNullable<ChartOption['series']> = [];
  answer.devices.forEach((d, i) => {
    const colour = DEVICE_COLOURS[i % DEVICE_COLOURS.length];
    series.push({
      type: 'line',
      name: `${d.device} allocated`,
      step: 'end',
      showSymbol: false,
      sampling: 'lttb',
      lineStyle: { width: 1.5, color: colour },
      itemStyle: { color: colour },
      data: d.t_ms.map((t, k) => [t, d.allocated[k]]),
      markArea: i === 0
        ? {
            silent: true,
            data: [
              ...answer.bands.map(([from, to, phase]) => [
                { xAxis: from, itemStyle: { color: phaseColour(phase), opacity: 0.12 } },
                { xAxis: to },
              ]),
              ...answer.apart.map(([from, to, kind]) => [
                { xAxis: from, itemStyle: { color: apartColour(asApart(kind) ?? 'paused'), opacity: 0.18 } },
                { xAxis: to },
              ]),
            ] as never,
          }
        : undefined,
    });
    if (d.reserved) {
      series.push({
        type: 'line',
        name: `${d.device} reserved`,
        step: 'end',
        showSymbol: false,
        lineStyle: { width: 1, type: 'dashed', color: colour },
        itemStyle: { color: colour },
        data: d.t_ms.map((t, k) => [t, d.reserved![k]]),
      });
    }
    series.push({
      type: 'line',
      name: `${d.device} peak`,
      data: [[d.peak_ms, d.peak_bytes]],
      showSymbol: true,
      symbol: 'pin',
      symbolSize: 26,
      itemStyle: { color: colour },
      label: { show: true, position: 'top', color: c.text, formatter: () => `peak ${bytes(d.peak_bytes)}` },
      tooltip: { show: false },
    });
  });
  const option: ChartOption = {
    ...baseOption(),
    grid: { left: 8, right: 24, top: 36, bottom: 36, containLabel: true },
    xAxis: stepTimeAxis(answer.wall_ms + answer.apart.reduce((t, [from, to]) => t + to - from, 0)),
    yAxis: { type: 'value', ...axis, axisLabel: { ...axis.axisLabel, formatter: (v: number) => bytes(v) } },
    tooltip: {
      ...baseOption().tooltip,
      trigger: 'axis',
      formatter: (params: unknown) => {
        const list = (params as { seriesName: string; value: [number, number] }[]).filter((p) => !p.seriesName.endsWith(' peak'));
        if (!list.length) return '';
        const t = list[0].value[0];
        const phase = answer.bands.find(([from, to]) => t >= from && t < to)?.[2];
        const apart = asApart(answer.apart.find(([from, to]) => t >= from && t < to)?.[2]);
        return tooltipBody(
          `${ms(t)} ms from the step's start`,
          list.map((p) => ({ label: p.seriesName, value: bytes(p.value[1]) })),
          phase ? `in ${phase}` : apart ? `in ${apartLabel(apart)}` : undefined,
        );
      },
    },
    dataZoom: [{ type: 'inside', xAxisIndex: 0, filterMode: 'none' }],
    series,
  };
  chart.setOption(option, true);
}
