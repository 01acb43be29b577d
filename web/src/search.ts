// Search: sessions by title or by what was said in them, across the tenant's whole catalogue (the relay
// filters `listSessions` with `_meta["ahpRelay/textContains"]`, reading turns server-side, paged, so sessions
// beyond the loaded pages are found), and text within the open chat's loaded turns, marked with the CSS Custom
// Highlight API (no change to the transcript's DOM).

import type { JsonObject } from "./rpc";

/** The `listSessions` `_meta` key the relay filters by: a session's title or any of its turns' text. */
export const TEXT_CONTAINS = "ahpRelay/textContains";

/** A search of the session catalogue: the query and what the relay found so far. */
export class SessionSearch {
  items = new Map<string, JsonObject>();
  cursor?: string;

  constructor(readonly query: string) {}

  /** The `listSessions` params of the next page. */
  params(limit: number, root: string): JsonObject {
    const params: JsonObject = { channel: root, limit, _meta: { [TEXT_CONTAINS]: this.query } };
    if (this.cursor) params.cursor = this.cursor;
    return params;
  }

  add(page: JsonObject): void {
    for (const item of page.items ?? []) this.items.set(item.resource, item);
    this.cursor = page.nextCursor ?? undefined;
  }

  matches(summary: JsonObject): boolean {
    return String(summary.title ?? "").toLowerCase().includes(this.query.toLowerCase());
  }

  /**
   * The sessions to list: what the relay found and what the page knows (renamed or added since), as the page
   * knows them now, still matching, newest first.
   */
  list(known: Map<string, JsonObject>): JsonObject[] {
    const all = new Map(this.items);
    for (const [uri, summary] of known) all.set(uri, summary);
    return [...all.values()]
      .map((summary) => known.get(summary.resource) ?? summary)
      // What the relay found (by its turns too) stays; what the page knows besides, by its title.
      .filter((summary) => this.items.has(summary.resource) || this.matches(summary))
      .sort((a, b) => String(b.modifiedAt ?? "").localeCompare(String(a.modifiedAt ?? "")));
  }
}

/** Finding text in the transcript: every occurrence marked, one of them current. */
export class FindInChat {
  private ranges: Range[] = [];
  private current = -1;
  query = "";

  /** Marks every occurrence of the query in `root`; returns how many there are. */
  mark(root: HTMLElement): number {
    this.ranges = [];
    const registry = (CSS as any).highlights as Map<string, unknown> | undefined;
    const needle = this.query.toLowerCase();
    if (needle) {
      // Text in one block (a paragraph, a code block, a cell) is searched as one string, whatever spans split
      // it (highlighted code, bold, links); blocks are never joined.
      for (const run of textRuns(root)) {
        const text = run.map((node) => node.textContent ?? "").join("").toLowerCase();
        for (let at = text.indexOf(needle); at >= 0; at = text.indexOf(needle, at + needle.length)) {
          const range = document.createRange();
          const [startNode, startOffset] = locate(run, at);
          const [endNode, endOffset] = locate(run, at + needle.length, true);
          range.setStart(startNode, startOffset);
          range.setEnd(endNode, endOffset);
          this.ranges.push(range);
        }
      }
    }
    if (this.current >= this.ranges.length) this.current = this.ranges.length - 1;
    if (registry && typeof Highlight !== "undefined") {
      registry.set("find", new Highlight(...this.ranges));
      const current = this.ranges[this.current];
      registry.set("find-current", current ? new Highlight(current) : new Highlight());
    }
    return this.ranges.length;
  }

  /** Moves to the next occurrence (the previous with `back`), scrolled into view; returns its 1-based place. */
  step(root: HTMLElement, back = false): number {
    if (this.ranges.length === 0) return 0;
    const n = this.ranges.length;
    this.current = back ? (this.current - 1 + n) % n : (this.current + 1) % n;
    this.mark(root);
    this.ranges[this.current]?.startContainer.parentElement?.scrollIntoView({ block: "center" });
    return this.current + 1;
  }

  get place(): number {
    return this.current + 1;
  }

  reset(query: string): void {
    this.query = query;
    this.current = -1;
  }
}

/** The elements whose text is one searchable run. */
const BLOCKS = "p,li,pre,td,th,h1,h2,h3,h4,h5,h6,blockquote,summary,div,label";

/** `root`'s text nodes, grouped by the block each lies in (consecutive nodes of one block form a run). */
function textRuns(root: HTMLElement): Text[][] {
  const runs: Text[][] = [];
  let block: Element | null | undefined;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode() as Text | null; node; node = walker.nextNode() as Text | null) {
    const owner = node.parentElement?.closest(BLOCKS);
    if (owner !== block || runs.length === 0) runs.push([]);
    block = owner;
    runs[runs.length - 1].push(node);
  }
  return runs;
}

/** The node and offset of character `at` of a run (`end`: a range's end may sit at a node's end). */
function locate(run: Text[], at: number, end = false): [Text, number] {
  let passed = 0;
  for (const node of run) {
    const length = node.length;
    if (at < passed + length || (end && at === passed + length)) return [node, at - passed];
    passed += length;
  }
  const last = run[run.length - 1];
  return [last, last.length];
}
