// The session's files: a pane that lists a directory of the session's workspace (`resourceList`), walks into
// folders and back up, and shows a file (`resourceRead`): text highlighted by its name's language, images as
// images, anything else described; and, for members, edits a small text file in place: saved with
// `resourceWrite` and `ifMatch` (the `etag` `resourceResolve` gave when the edit began), so a file changed
// meanwhile — by a teammate, the agent — is not overwritten: the page says so and keeps the text typed.
// Viewers see the same and edit nothing.

import { h } from "./dom";
import { highlightInto } from "./highlight";
import type { JsonObject } from "./rpc";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

/** The language of a file name, for highlighting. */
function languageOf(name: string): string | undefined {
  const extension = name.split(".").pop()?.toLowerCase() ?? "";
  const known: Record<string, string> = {
    rs: "rust", ts: "typescript", js: "javascript", mjs: "javascript", json: "json", py: "python", go: "go",
    sh: "bash", md: "markdown", toml: "toml", yaml: "yaml", yml: "yaml", css: "css", html: "html", sql: "sql",
    c: "c", h: "c", cpp: "cpp", java: "java", diff: "diff",
  };
  return known[extension];
}

/** A request to the relay. */
export type Ask = (method: string, params: JsonObject) => Promise<any>;

/** The largest text file the pane edits in place. */
const EDITABLE_BYTES = 256 * 1024;
/** AHP's error code for an `ifMatch` that is not the file's current `etag`. */
const PRECONDITION_FAILED = -32011;

export class FilesPane {
  /** The directory listed (a `file://` URI), and the pane's top. */
  private directory?: string;
  private top?: string;

  constructor(
    private ask: Ask,
    private canWrite: () => boolean,
  ) {}

  wire(): void {
    $("files-up").addEventListener("click", () => {
      if (!this.directory || this.directory === this.top) return;
      void this.list(this.directory.replace(/\/[^/]*$/, ""));
    });
  }

  /** Show `root` (the session's working directory). */
  async open(root: string): Promise<void> {
    this.top = root.replace(/\/+$/, "");
    await this.list(this.top);
  }

  private async list(directory: string): Promise<void> {
    this.directory = directory;
    $("files-path").textContent = decodeURIComponent(directory.replace(/^file:\/\//, ""));
    $<HTMLButtonElement>("files-up").disabled = directory === this.top;
    $("file-view").replaceChildren();
    let entries: JsonObject[];
    try {
      const listed = await this.ask("resourceList", { channel: "ahp-root://", uri: directory });
      entries = listed.entries ?? [];
    } catch (error) {
      $("files-list").replaceChildren(h("li", { class: "error" }, `Cannot list this folder: ${(error as Error).message}`));
      return;
    }
    entries.sort((a, b) => (a.type === b.type ? String(a.name).localeCompare(String(b.name)) : a.type === "directory" ? -1 : 1));
    $("files-list").replaceChildren(
      ...entries.map((entry) => {
        const folder = entry.type === "directory";
        const button = h(
          "button",
          { type: "button", class: folder ? "file-entry folder" : "file-entry", "data-name": entry.name },
          folder ? `${entry.name}/` : String(entry.name),
        );
        const uri = `${directory}/${entry.name}`;
        button.addEventListener("click", () => void (folder ? this.list(uri) : this.show(uri, String(entry.name))));
        return h("li", {}, button);
      }),
    );
    if (entries.length === 0) $("files-list").replaceChildren(h("li", { class: "muted" }, "This folder is empty."));
  }

  private async show(uri: string, name: string): Promise<void> {
    const view = $("file-view");
    view.replaceChildren(h("div", { class: "muted" }, `Opening ${name}…`));
    let read: JsonObject;
    try {
      read = await this.ask("resourceRead", { channel: "ahp-root://", uri });
    } catch (error) {
      view.replaceChildren(h("div", { class: "error" }, `Cannot open ${name}: ${(error as Error).message}`));
      return;
    }
    const head = h("div", { class: "file-head" }, h("strong", {}, name), ` · ${read.contentType ?? ""}`);
    if (read.encoding === "utf-8") {
      const code = h("code", { "data-lang": languageOf(name) ?? "" });
      highlightInto(code, String(read.data ?? ""), languageOf(name));
      view.replaceChildren(head, h("pre", { class: "file-text" }, code));
      if (this.canWrite() && new TextEncoder().encode(String(read.data ?? "")).length <= EDITABLE_BYTES) {
        const edit = h("button", { type: "button", class: "link file-edit-start" }, "Edit");
        edit.addEventListener("click", () => void this.edit(uri, name));
        head.append(" ", edit);
      }
    } else if (String(read.contentType ?? "").startsWith("image/")) {
      view.replaceChildren(head, h("img", { class: "file-image", alt: name, src: `data:${read.contentType};base64,${read.data}` }));
    } else {
      const bytes = Math.floor((String(read.data ?? "").length * 3) / 4);
      view.replaceChildren(head, h("div", { class: "muted" }, `A binary file (about ${bytes} bytes).`));
    }
  }

  /**
   * The file's text and the `etag` it has, read so that the two belong together (the same etag resolved before
   * and after the read); a file that keeps changing as it is read (a log, an agent writing it) is not edited.
   */
  private async versioned(uri: string): Promise<{ text: string; etag: string }> {
    for (let attempt = 0; attempt < 3; attempt++) {
      const before = await this.ask("resourceResolve", { channel: "ahp-root://", uri });
      const read = await this.ask("resourceRead", { channel: "ahp-root://", uri });
      const after = await this.ask("resourceResolve", { channel: "ahp-root://", uri });
      if (before.etag && before.etag === after.etag) return { text: String(read.data ?? ""), etag: String(after.etag) };
    }
    throw new Error("it keeps changing while it is read; try again when it is still");
  }

  /** Edit text file `uri` in place; Save writes it only if nobody changed it since the edit began. */
  private async edit(uri: string, name: string): Promise<void> {
    const view = $("file-view");
    let opened: { text: string; etag: string };
    try {
      opened = await this.versioned(uri);
    } catch (error) {
      view.append(h("div", { class: "error" }, `Cannot edit ${name}: ${(error as Error).message}`));
      return;
    }
    const box = h("textarea", { class: "file-editor", "aria-label": `Contents of ${name}`, spellcheck: "false", rows: "18" }) as HTMLTextAreaElement;
    box.value = opened.text;
    const save = h("button", { type: "button", class: "file-save" }, "Save") as HTMLButtonElement;
    const cancel = h("button", { type: "button", class: "link" }, "Cancel");
    const status = h("span", { class: "file-edit-status muted", role: "status" });
    view.replaceChildren(h("div", { class: "file-head" }, h("strong", {}, name), " · editing"), box, h("div", { class: "actions" }, save, cancel, status));
    box.focus();
    cancel.addEventListener("click", () => void this.show(uri, name));
    save.addEventListener("click", async () => {
      save.disabled = true;
      status.textContent = "Saving…";
      try {
        await this.ask("resourceWrite", {
          channel: "ahp-root://",
          uri,
          data: box.value,
          encoding: "utf-8",
          mode: "truncate",
          ifMatch: opened.etag,
        });
      } catch (error) {
        save.disabled = false;
        const code = (error as { code?: number }).code;
        status.textContent =
          code === PRECONDITION_FAILED
            ? `${name} changed since you began editing; your text is kept here. Cancel to see the new version.`
            : `Not saved: ${(error as Error).message}`;
        status.classList.add("error");
        return;
      }
      await this.show(uri, name);
      $("file-view").querySelector(".file-head")?.append(h("span", { class: "file-saved", role: "status" }, " · saved"));
    });
  }
}
