// esbuild's "text" loader turns a stylesheet into a string the module injects itself.
declare module '*.css' {
  const text: string;
  export default text;
}
