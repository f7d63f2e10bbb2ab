/**
 * One colour per phase, the same in every view. The canonical phases and their colours come from
 * the server (`/runs`, read from the phase registry in phaseprof/contract.py); a user's own phase
 * takes a colour from the server's palette by a hash of its name, so it keeps it whatever order
 * phases appear in.
 */

import type { RunsAnswer } from './types';

let canonical = new Map<string, string>();
let palette: string[] = [];

/** Take the phase colours of a `/runs` answer. */
export function usePhaseColours(runs: Pick<RunsAnswer, 'phases' | 'user_phase_colours'>): void {
  canonical = new Map(runs.phases.map((p) => [p.name, p.colour]));
  palette = runs.user_phase_colours;
}

export function phaseColour(phase: string): string {
  const known = canonical.get(phase);
  if (known) return known;
  if (!palette.length) return '#9e9e9e';
  let hash = 2166136261; // FNV-1a over UTF-16 code units, as phaseprof.contract.phase_colour
  for (let i = 0; i < phase.length; i++) hash = Math.imul(hash ^ phase.charCodeAt(i), 16777619);
  return palette[(hash >>> 0) % palette.length];
}
