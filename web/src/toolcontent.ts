// A tool call's result content (AHP `ToolResultContent`) as DOM: text as text, file edits as a line diff of
// their before/after sides when those are inline (`data:` URIs, as the relay's runners send them), terminals
// with their exit code, images from embedded resources, sub-agents and resources by title and URI. Anything
// else is shown as its JSON. Built with text nodes only.

import { h } from "./dom";
import type { JsonObject } from "./rpc";

/** Diffs bigger than this (lines before × lines after) show the new side only. */
const MAX_DIFF_CELLS = 1_000_000;
/** Embedded images up to this many base64 characters are shown inline. */
const MAX_INLINE_IMAGE = 2_000_000;

/** One item of a tool call's content; `finished` when the call itself is over (its terminal then runs no more). */
export function renderToolContent(item: JsonObject, finished = false): HTMLElement {
  switch (item.type) {
    case "text":
      return h("pre", { class: "tool-output" }, String(item.text ?? ""));
    case "fileEdit":
      return renderFileEdit(item);
    case "terminal": {
      const exit = item.result?.exitCode;
      // A command whose exit the agent did not report is not "running" once its tool call is over.
      const status = exit !== undefined && exit !== null ? `exit code ${exit}` : finished ? "ended" : "running";
      return h("div", { class: "tool-output terminal" }, `${item.title ?? "Terminal"} · ${status}`);
    }
    case "subagent":
      return h(
        "div",
        { class: "tool-output subagent" },
        h("strong", {}, String(item.title ?? "Sub-agent")),
        item.description ? ` — ${item.description}` : "",
      );
    case "embeddedResource": {
      const type = String(item.contentType ?? "");
      const data = String(item.data ?? "");
      if (/^image\/(png|jpeg|gif|webp)$/.test(type) && data.length <= MAX_INLINE_IMAGE && /^[A-Za-z0-9+/=]*$/.test(data)) {
        return h("img", { class: "tool-output", alt: "tool output", src: `data:${type};base64,${data}` });
      }
      return h("div", { class: "tool-output" }, `${type || "binary"} content, ${Math.round((data.length * 3) / 4)} bytes`);
    }
    case "resource":
      return h("div", { class: "tool-output" }, `resource ${item.uri ?? ""}${item.contentType ? ` (${item.contentType})` : ""}`);
    default:
      return h("pre", { class: "tool-output" }, JSON.stringify(item, null, 2));
  }
}

function renderFileEdit(edit: JsonObject): HTMLElement {
  const uri = String(edit.after?.uri ?? edit.before?.uri ?? "");
  const path = uri.startsWith("file://") ? decodeURIComponent(uri.slice("file://".length)) : uri;
  const verb = !edit.before ? "created" : !edit.after ? "deleted" : "edited";
  const stats = edit.diff ?? {};
  const head = h(
    "div",
    { class: "diff-head" },
    `${verb} `,
    h("code", {}, path),
    stats.added !== undefined ? h("span", { class: "added" }, ` +${stats.added}`) : "",
    stats.removed !== undefined ? h("span", { class: "removed" }, ` −${stats.removed}`) : "",
  );
  const before = edit.before ? inlineText(edit.before.content?.uri) : "";
  const after = edit.after ? inlineText(edit.after.content?.uri) : "";
  const box = h("div", { class: "tool-output file-edit", "data-path": path }, head);
  if (before === undefined || after === undefined) return box; // content held elsewhere: the header only
  const pre = h("pre", { class: "diff" });
  for (const [op, line] of lineDiff(before, after)) {
    pre.append(h("span", { class: op === "+" ? "add" : op === "-" ? "del" : "same" }, `${op} ${line}\n`));
  }
  box.append(pre);
  return box;
}

/** The text of a `data:` URI (base64 or percent-encoded, UTF-8), or undefined for any other URI. */
export function inlineText(uri: unknown): string | undefined {
  if (typeof uri !== "string" || !uri.startsWith("data:")) return undefined;
  const comma = uri.indexOf(",");
  if (comma < 0) return undefined;
  const meta = uri.slice(5, comma);
  const payload = uri.slice(comma + 1);
  try {
    if (meta.split(";").includes("base64")) {
      const bytes = Uint8Array.from(atob(payload), (c) => c.charCodeAt(0));
      return new TextDecoder().decode(bytes);
    }
    return decodeURIComponent(payload);
  } catch {
    return undefined;
  }
}

/** A line diff by longest common subsequence: `[op, line]` with op `" "`, `"-"` or `"+"`. */
export function lineDiff(before: string, after: string): [string, string][] {
  const a = before === "" ? [] : before.replace(/\n$/, "").split("\n");
  const b = after === "" ? [] : after.replace(/\n$/, "").split("\n");
  if (a.length * b.length > MAX_DIFF_CELLS) {
    return [...a.map((l): [string, string] => ["-", l]), ...b.map((l): [string, string] => ["+", l])];
  }
  // lcs[i][j]: length of the common subsequence of a[i..] and b[j..].
  const width = b.length + 1;
  const lcs = new Uint32Array((a.length + 1) * width);
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      lcs[i * width + j] = a[i] === b[j] ? lcs[(i + 1) * width + j + 1] + 1 : Math.max(lcs[(i + 1) * width + j], lcs[i * width + j + 1]);
    }
  }
  const out: [string, string][] = [];
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) {
    if (a[i] === b[j]) {
      out.push([" ", a[i]]);
      i++;
      j++;
    } else if (lcs[(i + 1) * width + j] >= lcs[i * width + j + 1]) {
      out.push(["-", a[i++]]);
    } else {
      out.push(["+", b[j++]]);
    }
  }
  while (i < a.length) out.push(["-", a[i++]]);
  while (j < b.length) out.push(["+", b[j++]]);
  return out;
}
