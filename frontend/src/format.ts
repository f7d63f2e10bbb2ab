/**
 * How numbers read on screen. Times keep the API's microsecond resolution (3 decimals of a ms) so
 * what the tab shows is exactly what the backend computed.
 */

const DASH = '–';

export function ms(value: number | null | undefined): string {
  return value === null || value === undefined ? DASH : value.toFixed(3);
}

/** A difference, always signed: `+1.200` / `-0.300` / `0.000`. */
export function signedMs(value: number): string {
  return (value > 0 ? '+' : '') + value.toFixed(3);
}

/** A share in [0, 1] as a percentage with one decimal. */
export function pct(share: number | null | undefined): string {
  return share === null || share === undefined || !Number.isFinite(share) ? DASH : `${(share * 100).toFixed(1)}%`;
}

/** Relative change of `b` against `a`, e.g. `+12.5%`; a dash where `a` is zero. */
export function change(a: number, b: number): string {
  if (a === 0) return DASH;
  const rel = ((b - a) / a) * 100;
  return (rel > 0 ? '+' : '') + rel.toFixed(1) + '%';
}

/** A count of things, with thousands separators: `50,000`. */
export function thousands(value: number): string {
  return value.toLocaleString('en-US');
}

/** Calls per step: whole numbers as they are, means with two decimals. */
export function count(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toFixed(2);
}

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

export function bytes(value: number | null | undefined, signed = false): string {
  if (value === null || value === undefined) return DASH;
  let v = Math.abs(value);
  let unit = 0;
  while (v >= 1024 && unit < UNITS.length - 1) {
    v /= 1024;
    unit += 1;
  }
  const sign = value < 0 ? '-' : signed && value > 0 ? '+' : '';
  return `${sign}${unit === 0 ? v.toFixed(0) : v.toFixed(1)} ${UNITS[unit]}`;
}
