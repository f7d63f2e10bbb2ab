/** One colour per phase, the same in every view; the user's own phases get a stable colour by name. */

const CANONICAL: Record<string, string> = {
  data: '#26a69a',
  forward: '#42a5f5',
  backward: '#ffa726',
  optimizer: '#66bb6a',
  other: '#9e9e9e',
};

const USER_PHASES = ['#ab47bc', '#ec407a', '#8d6e63', '#5c6bc0', '#d4e157', '#26c6da', '#ffca28', '#78909c'];

export function phaseColour(phase: string): string {
  const known = CANONICAL[phase];
  if (known) return known;
  let hash = 2166136261; // FNV-1a: the colour follows the name, not the order phases appear in
  for (let i = 0; i < phase.length; i++) hash = Math.imul(hash ^ phase.charCodeAt(i), 16777619);
  return USER_PHASES[(hash >>> 0) % USER_PHASES.length];
}
