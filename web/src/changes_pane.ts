// The session's changes: its changesets (the last turn's, and all of them), each changed file with the lines it
// added and removed, its diff (both sides read with `resourceRead`, compared line by line with jsdiff), a review
// mark every device shares (`changeset/filesReviewChanged`), and revert — one file, or all of them — after the
// changeset's own confirmation text (both are destructive). Viewers see the same and may not mark or revert.

import { diffLines } from "diff";
import { h } from "./dom";
import type { JsonObject } from "./rpc";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

/** What the pane needs of the page. */
export interface ChangesHost {
  ask(method: string, params: JsonObject): Promise<any>;
  dispatch(channel: string, action: JsonObject): void;
  subscribe(uri: string): Promise<boolean>;
  unsubscribe(uri: string): void;
  state(uri: string): JsonObject | undefined;
  /** Asks the user to confirm `text`; whether they did. */
  confirm(text: string, action: string): Promise<boolean>;
  canWrite(): boolean;
}

export class ChangesPane {
  /** The changeset shown, and the file whose diff is open. */
  private uri?: string;
  private openFile?: string;
  private session?: JsonObject;
  private turnId?: string;

  constructor(private host: ChangesHost) {}

  wire(): void {
    $("changes-scope").addEventListener("change", () => void this.show());
    $("changes-revert-all").addEventListener("click", () => void this.revertAll());
  }

  /** Show the changes of `session` (its catalogue) as of its chat's last turn `turnId`. */
  async open(session: JsonObject, turnId: string | undefined): Promise<void> {
    this.session = session;
    this.turnId = turnId;
    const scope = $<HTMLSelectElement>("changes-scope");
    const turn = scope.querySelector<HTMLOptionElement>('option[value="turn"]');
    if (turn) turn.disabled = !turnId;
    if (!turnId) scope.value = "session";
    await this.show();
  }

  close(): void {
    if (this.uri) this.host.unsubscribe(this.uri);
    this.uri = undefined;
    this.openFile = undefined;
  }

  /** The channel the scope picked names. */
  private uriOf(kind: string): string | undefined {
    const entry = (this.session?.changesets ?? []).find((changeset: JsonObject) => changeset.changeKind === kind);
    if (!entry) return undefined;
    return String(entry.uriTemplate).replace("{turnId}", encodeURIComponent(this.turnId ?? ""));
  }

  private async show(): Promise<void> {
    const uri = this.uriOf($<HTMLSelectElement>("changes-scope").value);
    if (uri !== this.uri) {
      if (this.uri) this.host.unsubscribe(this.uri);
      this.uri = uri;
      this.openFile = undefined;
      if (uri) await this.host.subscribe(uri);
    }
    this.render();
  }

  /** Whether `channel` is the one shown (the page re-renders the pane when it moves). */
  shows(channel: string): boolean {
    return channel === this.uri;
  }

  render(): void {
    const state = this.uri ? this.host.state(this.uri) : undefined;
    const status = $("changes-status");
    const list = $("changes-list");
    if (!state) {
      status.textContent = this.uri ? "Opening…" : "This session has no changes to show.";
      list.replaceChildren();
      return;
    }
    const files: JsonObject[] = state.files ?? [];
    const added = files.reduce((sum, file) => sum + Number(file.edit?.diff?.added ?? 0), 0);
    const removed = files.reduce((sum, file) => sum + Number(file.edit?.diff?.removed ?? 0), 0);
    status.textContent =
      state.status === "error"
        ? `Cannot show these changes: ${state.error?.message ?? "an error"}`
        : state.status === "computing" || state.status === "recomputing"
          ? "Looking for changes…"
          : files.length === 0
            ? "No changes."
            : `${files.length} ${files.length === 1 ? "file" : "files"} changed, +${added} −${removed}`;
    const writer = this.host.canWrite();
    $<HTMLButtonElement>("changes-revert-all").hidden = !writer || files.length === 0;
    list.replaceChildren(...files.map((file) => this.row(file, writer)));
    if (this.openFile && files.some((file) => file.id === this.openFile)) void this.showDiff(this.openFile);
  }

  private row(file: JsonObject, writer: boolean): HTMLElement {
    const id = String(file.id);
    const stats = file.edit?.diff ?? {};
    const kind = !file.edit?.before ? "added" : !file.edit?.after ? "deleted" : "modified";
    const name = h("button", { type: "button", class: "link change-name", "data-file": id }, id);
    name.addEventListener("click", () => {
      this.openFile = this.openFile === id ? undefined : id;
      this.render();
    });
    const reviewed = h("input", { type: "checkbox", class: "change-reviewed", "aria-label": `Reviewed ${id}` });
    reviewed.checked = file.reviewed === true;
    reviewed.disabled = !writer;
    reviewed.addEventListener("change", () => {
      if (this.uri) {
        this.host.dispatch(this.uri, { type: "changeset/filesReviewChanged", files: [id], reviewed: reviewed.checked });
      }
    });
    const revert = h("button", { type: "button", class: "link danger change-revert", "aria-label": `Revert ${id}` }, "Revert");
    revert.hidden = !writer;
    revert.addEventListener("click", () => void this.revert(id, kind));
    const row = h(
      "li",
      { class: `change ${kind}`, "data-file": id },
      h("label", { class: "change-review" }, reviewed, h("span", { class: "muted" }, "Reviewed")),
      name,
      h("span", { class: "change-kind muted" }, kind),
      h("span", { class: "change-stats" }, h("span", { class: "plus" }, `+${stats.added ?? "?"}`), " ", h("span", { class: "minus" }, `−${stats.removed ?? "?"}`)),
      revert,
    );
    if (this.openFile === id) row.append(h("div", { class: "change-diff", id: "change-diff" }, h("span", { class: "muted" }, "Loading the diff…")));
    return row;
  }

  /** Both sides of `id`, compared line by line. */
  private async showDiff(id: string): Promise<void> {
    const state = this.uri ? this.host.state(this.uri) : undefined;
    const file = (state?.files ?? []).find((entry: JsonObject) => entry.id === id);
    const box = document.getElementById("change-diff");
    if (!file || !box || box.dataset.shown === JSON.stringify(file.edit)) return;
    box.dataset.shown = JSON.stringify(file.edit);
    const side = async (edit: JsonObject | undefined): Promise<string | undefined> => {
      if (!edit) return "";
      const read = await this.host.ask("resourceRead", { channel: "ahp-root://", uri: edit.content.uri, encoding: "utf-8" });
      return read.encoding === "utf-8" ? String(read.data ?? "") : undefined;
    };
    let before: string | undefined;
    let after: string | undefined;
    try {
      [before, after] = await Promise.all([side(file.edit.before), side(file.edit.after)]);
    } catch (error) {
      box.replaceChildren(h("span", { class: "error" }, `Cannot read this file: ${(error as Error).message}`));
      return;
    }
    if (before === undefined || after === undefined) {
      box.replaceChildren(h("span", { class: "muted" }, "A binary file: no line diff."));
      return;
    }
    const lines: HTMLElement[] = [];
    for (const part of diffLines(before, after)) {
      const mark = part.added ? "+" : part.removed ? "-" : " ";
      const cls = part.added ? "diff-add" : part.removed ? "diff-del" : "diff-same";
      for (const line of part.value.replace(/\n$/, "").split("\n")) {
        lines.push(h("div", { class: cls }, `${mark} ${line}`));
      }
    }
    box.replaceChildren(h("pre", { class: "diff", "aria-label": `Changes to ${id}` }, ...lines));
  }

  private operation(id: string): JsonObject | undefined {
    const state = this.uri ? this.host.state(this.uri) : undefined;
    return (state?.operations ?? []).find((operation: JsonObject) => operation.id === id);
  }

  /** Revert file `id` after saying what that does to it: a file these changes created is deleted. */
  private async revert(id: string, kind: "added" | "deleted" | "modified"): Promise<void> {
    const operation = this.operation("revert-file");
    if (!this.uri || !operation) return;
    const what =
      kind === "added"
        ? `${id} was created by these changes: reverting deletes it, and its content is lost.`
        : kind === "deleted"
          ? `${id} was deleted by these changes: reverting puts it back as it was.`
          : `${id} goes back to how it was before these changes: its changes are lost.`;
    const action = kind === "added" ? "Delete the file" : kind === "deleted" ? "Restore the file" : "Revert";
    if (!(await this.host.confirm(what, action))) return;
    await this.invoke("revert-file", { kind: "resource", resource: id });
  }

  private async revertAll(): Promise<void> {
    const operation = this.operation("revert-all");
    if (!this.uri || !operation) return;
    if (!(await this.host.confirm(String(operation.confirmation ?? "Revert every file?"), "Revert all"))) return;
    await this.invoke("revert-all", undefined);
  }

  private async invoke(operationId: string, target: JsonObject | undefined): Promise<void> {
    try {
      await this.host.ask("invokeChangesetOperation", { channel: this.uri, operationId, ...(target ? { target } : {}) });
    } catch (error) {
      $("changes-status").textContent = `Not done: ${(error as Error).message}`;
    }
  }
}
