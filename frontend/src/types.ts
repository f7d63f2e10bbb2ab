/** The JSON the routes of plugin/http_api.md answer with. */

export type Device = 'cpu' | 'gpu';
export type Verdict = 'cpu-bound' | 'gpu-bound' | 'balanced' | null;

export interface SpanInfo {
  file: string;
  size: number;
  state: 'pending' | 'loading' | 'ready' | 'error';
  steps: number | null;
  error: string | null;
}

export interface WorkerInfo {
  worker: string;
  rank: number | null;
  state: 'loading' | 'ready';
  spans: SpanInfo[];
}

export interface RunInfo {
  run: string;
  has_scalars: boolean;
  workers: WorkerInfo[];
}

export interface FileError {
  path: string;
  error: string;
}

export interface RunsResponse {
  runs: RunInfo[];
  loading: { files: number; done: number; bytes: number; bytes_done: number };
  errors: FileError[];
}

export interface PhaseTimes {
  cpu_ms: number;
  gpu_ms: number;
  gpu_idle_ms: number | null;
  launches: number;
  verdict: Verdict;
  inferred: boolean;
}

export interface StepRow {
  step: number;
  span: string;
  start_ms: number;
  wall_ms: number;
  gpu_ms: number;
  gpu_idle_ms: number | null;
  inferred: boolean;
  inferred_phases: string[];
  empty: boolean;
  phases: Record<string, PhaseTimes>;
}

export interface PhaseMean {
  cpu_ms: number;
  gpu_ms: number;
  gpu_idle_ms: number | null;
  share: number;
}

/** An op aggregated over steps (mean per step) or within one step. */
export interface OpRow {
  name: string;
  calls: number;
  self_cpu_ms: number;
  cpu_ms: number;
  self_gpu_ms: number;
  gpu_ms: number;
  shapes?: string | null;
}

/** An op on both sides of a comparison; deltas are B - A. */
export interface ChangedOp {
  phase: string;
  name: string;
  a_calls: number;
  b_calls: number;
  a_cpu_ms: number;
  b_cpu_ms: number;
  delta_cpu_ms: number;
  a_self_cpu_ms: number;
  b_self_cpu_ms: number;
  delta_self_cpu_ms: number;
  a_gpu_ms: number;
  b_gpu_ms: number;
  delta_gpu_ms: number;
}

export interface Slowest {
  step: number;
  wall_ms: number;
  median_step?: number;
  vs_median_ms?: number;
  phase?: string;
  phase_delta_ms?: number;
  ops?: ChangedOp[];
}

/** A worker's summary; the figures after `phases` are absent when no step holds work. */
export interface Summary {
  steps: number;
  empty_steps: number[];
  gpu: boolean;
  phases: string[];
  findings: string[];
  mean_wall_ms?: number;
  median_wall_ms?: number;
  mean?: Record<string, PhaseMean>;
  dominant_phase?: string;
  slowest?: Slowest;
  outliers?: number[];
  top_ops?: OpRow[];
  inferred_phases?: string[];
}

export interface StepsResponse {
  run: string;
  worker: string;
  workers: string[];
  phases: string[];
  gpu: boolean;
  steps: StepRow[];
  summary: Summary;
}

export interface MemoryFigures {
  peak_bytes: number | null;
  delta_bytes: number;
}

/** `[lane, start_ms, end_ms, phase]`, times relative to the step's start. */
export type Band = [number, number, number, string];

export interface StepDetail extends StepRow {
  run: string;
  worker: string;
  ops: Record<string, OpRow[]>;
  memory: Record<string, Record<string, MemoryFigures>>;
  lanes: { labels: string[]; bands: Band[] };
  gpu_names: string[];
}

export type Series = (number | null)[];

export interface TimelineResponse {
  run: string;
  phases: string[];
  steps: number[];
  cpu: Record<string, Series>;
  gpu: Record<string, Series>;
  wall: Series;
  profiled: [number, number][];
  downsampled: boolean;
}

export interface SideTimes {
  wall_ms: number;
  phases: Record<string, { cpu_ms: number; gpu_ms: number }>;
}

export interface CompareSide extends SideTimes {
  label: string;
  steps: number[];
}

export interface CompareResponse {
  a: CompareSide;
  b: CompareSide;
  delta: SideTimes;
  ops: ChangedOp[];
  phases: string[];
}

export interface RankRow extends SideTimes {
  worker: string;
  rank: number | null;
  steps: number;
  /** Mean time per step in collectives (host, or device time of their kernels). */
  comm_ms: number;
}

export interface Straggler {
  worker: string;
  rank: number | null;
  wall_ms: number;
  behind_median_ms: number;
  comm_ms: number;
  median_comm_ms: number;
  /** True when the other ranks wait for it at collectives; else it has the longest steps. */
  waited_for: boolean;
  /** Why it is the straggler, in a sentence. */
  reason: string;
  phase: string;
  phase_behind_ms: number;
}

export interface RanksResponse {
  run: string;
  phases: string[];
  ranks: RankRow[];
  straggler: Straggler | null;
}
