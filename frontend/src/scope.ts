/** The life of one rendering of a view: what to undo when it is replaced, and whether it still is. */

export class Scope {
  private cleanups: (() => void)[] = [];
  private disposed = false;

  /** False once the view was replaced: an answer arriving then must not touch the page. */
  get live(): boolean {
    return !this.disposed;
  }

  onDispose(cleanup: () => void): void {
    this.cleanups.push(cleanup);
  }

  dispose(): void {
    this.disposed = true;
    for (const cleanup of this.cleanups.splice(0)) cleanup();
  }
}
