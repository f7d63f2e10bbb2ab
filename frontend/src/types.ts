/**
 * The JSON the routes of plugin/http_api.md answer with. The answers themselves are generated from
 * plugin/answers.py into answers.ts (`python -m phaseprof.plugin.typescript`); here are only names
 * the views give to parts of them.
 */

import type { Lanes, MeanOp, PhaseTimes, StepDetail, TimelineAnswer } from './answers';

export type * from './answers';

export type Device = 'cpu' | 'gpu';
export type Verdict = PhaseTimes['verdict'];

/** `[lane, start_ms, end_ms, phase]`, times relative to the step's start. */
export type Band = Lanes['bands'][number];

/** `[start_ms, end_ms, kind]`: a stretch of a step's window kept out of the step. */
export type ApartBand = StepDetail['apart'][number];

/** A value per step of the timeline; null where a step has none. */
export type Series = TimelineAnswer['wall'];

/** An op as the ops tables show it: mean per step (`MeanOp`) or within one step (`OpRow`, with shapes
 * and, recorded with stacks, where in the code it was called). */
export type OpFigures = MeanOp & { shapes?: string | null; stack?: string[]; frame?: string };
