/**
 * Kernel names as a table can show them. CUDA kernel names are C++ signatures hundreds of characters
 * long (`void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<…>(…)::{lambda(int)#1}>(…)`),
 * and the kernels of one template share their first hundred: cut to a width, every row reads the same.
 *
 * Each name is shown in the shortest of three forms that no other name of the table shares:
 *  1. its kernel's name alone: `elementwise_kernel`, `volta_sgemm_64x64_nt`;
 *  2. that name with its template arguments, stripped of namespaces, parameter lists and lambda
 *     plumbing, which is where kernels of one template differ:
 *     `elementwise_kernel<128, 2, gpu_kernel_impl<direct_copy_kernel_cuda::λ(float)>::λ(int)>`;
 *  3. the full name.
 * Names that are not C++ (`Memcpy HtoD (Pageable -> Device)`) stay as they are. The full name is
 * always the cell's title (hover) and what the CSV holds.
 */

/** `name` without its trailing top-level `(…)` (a kernel's parameter list). */
function withoutParameters(name: string): string {
  if (!name.endsWith(')')) return name;
  let depth = 0;
  for (let i = name.length - 1; i >= 0; i -= 1) {
    if (name[i] === ')') depth += 1;
    else if (name[i] === '(') {
      depth -= 1;
      if (depth === 0) return name.slice(0, i);
    }
  }
  return name;
}

/** Form 2: the name with its template arguments, without namespaces, parameter lists or lambda plumbing. */
export function templateForm(name: string): string {
  let s = withoutParameters(name.replace(/^void /, ''));
  s = s.replace(/\(anonymous namespace\)::/g, '');
  s = s.replace(/::operator\(\)\(\) const/g, '');
  // a lambda keeps its parameter types, in brackets while parameter lists are taken out
  s = s.replace(/\{lambda\(([^(){}]*)\)#\d+\}/g, 'λ[$1]');
  for (let before = ''; before !== s; ) {
    before = s;
    s = s.replace(/\([^()]*\)/g, '');
  }
  s = s.replace(/\b[A-Za-z_]\w*::(?!λ)/g, ''); // namespaces and classes; a function keeps its lambdas
  s = s.replace(/::operator::/g, '::').replace(/::λ\[\]/g, '').replace(/λ\[([^\]]*)\]/g, 'λ($1)');
  return s.replace(/\s+>/g, '>').replace(/\s+/g, ' ').trim();
}

/** Form 1: the kernel's own name, without namespaces, template arguments or parameters. */
export function baseForm(name: string): string {
  const s = templateForm(name);
  const open = s.indexOf('<');
  return open > 0 ? s.slice(0, open) : s;
}

function isCpp(name: string): boolean {
  return /^void |::|</.test(name) || /^\w+\(.*\)$/.test(name);
}

/** For each name: the shortest form of it no other name in `names` shares (see above). */
export function kernelLabels(names: string[]): Map<string, string> {
  const unique = [...new Set(names)];
  const forms = [baseForm, templateForm];
  const out = new Map<string, string>();
  let open = unique.filter((n) => {
    if (!isCpp(n)) out.set(n, n);
    return isCpp(n);
  });
  for (const form of forms) {
    const count = new Map<string, number>();
    const shown = (n: string) => form(n) || n;
    // a form is taken only where neither another name's form nor another name itself reads the same
    for (const n of unique) {
      const key = out.has(n) ? (out.get(n) as string) : shown(n);
      count.set(key, (count.get(key) ?? 0) + 1);
    }
    open = open.filter((n) => {
      if (count.get(shown(n)) === 1) {
        out.set(n, shown(n));
        return false;
      }
      return true;
    });
  }
  for (const n of open) out.set(n, n);
  return out;
}
