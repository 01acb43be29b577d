// A turn of the transcript as DOM: the prompt (folded when long; Edit), the reply's parts (Markdown, reasoning,
// tool cards with their input, output and who decided, answered questions), Copy and Retry, and how it ended.
// Everything is built from text nodes (see dom.ts, markdown.ts); what a button does is the caller's.

import { copyButton, h } from "./dom";
import { toolState } from "./labels";
import { renderMarkdown } from "./markdown";
import type { JsonObject } from "./rpc";
import { renderToolContent } from "./toolcontent";

/** The `_meta` key of a tool call's confirmation naming who decided, from which device. */
export const DECIDED_BY = "ahp-relay/decidedBy";

/** A prompt longer than this (characters or lines) is folded with "Show more". */
const LONG_PROMPT_CHARS = 600;
const LONG_PROMPT_LINES = 8;

/** The `_meta` key of a message naming who wrote it (the relay stamps it: `{sub}`). */
export const AUTHOR = "ahpRelay/author";
/** The `_meta` key of the relay's system note naming who answered an input request (`{sub, requestId}`). */
const ANSWERED_BY = "ahpRelay/answeredBy";

/** What a turn offers, by its place in the chat and who is looking. */
export interface TurnOffers {
  edit: boolean;
  retry: boolean;
  /** Fork the chat through this turn into a new chat. */
  fork: boolean;
  /** Who wrote the prompt, as the page names them ("You" for the viewer's own). */
  author?: string;
  /** The turn before it, which an edit or retry truncates to (none: the chat's first). */
  before?: string;
}

/** What the turn's buttons do. */
export interface TurnActions {
  /** Edit the prompt shown in `prompt` of `node` in place. */
  edit(node: HTMLElement, prompt: HTMLElement, text: string, before: string | undefined): void;
  /** Run `message` again in place of the turns after `before`. */
  retry(before: string | undefined, message: JsonObject): void;
  /** A new chat continuing from this turn. */
  fork(turnId: string): void;
}

export function renderTurn(turn: JsonObject, offers: TurnOffers, actions: TurnActions): HTMLElement {
  const node = h("li", { class: `turn ${turn.state ?? ""}`, "data-turn": turn.id });
  const text = String(turn.message?.text ?? "");
  // In a shared chat, whose words these are.
  if (offers.author) node.append(h("div", { class: "author" }, offers.author));
  const prompt = h("div", { class: "user" }, text);
  node.append(prompt);
  // A long prompt is folded to a few lines, with a way to read it all.
  if (text.length > LONG_PROMPT_CHARS || text.split("\n").length > LONG_PROMPT_LINES) {
    prompt.classList.add("folded");
    const more = h("button", { type: "button", class: "link show-more", "aria-expanded": "false" }, "Show more");
    more.addEventListener("click", () => {
      const folded = prompt.classList.toggle("folded");
      more.textContent = folded ? "Show more" : "Show less";
      more.setAttribute("aria-expanded", String(!folded));
    });
    node.append(h("div", { class: "prompt-actions" }, more));
  }
  if (offers.edit) {
    const edit = h("button", { type: "button", class: "link edit-prompt", title: "Edit this prompt and send it again" }, "Edit");
    edit.addEventListener("click", () => actions.edit(node, prompt, text, offers.before));
    let promptActions = node.querySelector(".prompt-actions");
    if (!promptActions) node.append((promptActions = h("div", { class: "prompt-actions" })));
    promptActions.append(edit);
  }
  const reply = h("div", { class: "reply" });
  // Who answered each input request: the relay's note, shown with the request rather than apart.
  const answeredBy = new Map<string, string>();
  for (const part of turn.responseParts ?? []) {
    const by = part.kind === "systemNotification" ? part._meta?.[ANSWERED_BY] : undefined;
    if (by?.requestId) answeredBy.set(String(by.requestId), String(by.sub ?? ""));
  }
  for (const part of turn.responseParts ?? []) {
    if (part.kind === "systemNotification" && part._meta?.[ANSWERED_BY]) continue;
    reply.append(renderPart(part, answeredBy));
  }
  node.append(reply);
  if (turn.state && turn.state !== "active") {
    const replyActions = h("div", { class: "reply-actions" });
    const markdown = (turn.responseParts ?? [])
      .filter((part: JsonObject) => part.kind === "markdown")
      .map((part: JsonObject) => String(part.content ?? ""))
      .join("\n\n");
    if (markdown) {
      replyActions.append(copyButton(markdown, "copy-reply"));
    }
    if (offers.retry) {
      const retry = h("button", { type: "button", class: "link retry-turn", title: "Run this prompt again in a new branch" }, "Retry");
      retry.addEventListener("click", () => actions.retry(offers.before, turn.message ?? { text }));
      replyActions.append(retry);
    }
    if (offers.fork) {
      const fork = h("button", { type: "button", class: "link fork-turn", title: "Continue from here in a new chat" }, "Fork");
      fork.addEventListener("click", () => actions.fork(turn.id));
      replyActions.append(fork);
    }
    if (replyActions.childElementCount > 0) node.append(replyActions);
  }
  if (turn.error) node.append(h("div", { class: "error" }, `error: ${turn.error.message ?? ""}`));
  if (turn.state && turn.state !== "active") {
    const usage = turn.usage ? ` · ${turn.usage.inputTokens ?? 0} in / ${turn.usage.outputTokens ?? 0} out` : "";
    node.append(h("div", { class: "turn-end", "data-state": turn.state }, `${turn.state}${usage}`));
  }
  return node;
}

function renderPart(part: JsonObject, answeredBy: Map<string, string>): Node {
  switch (part.kind) {
    case "markdown": {
      const body = h("div", { class: "markdown" });
      body.append(renderMarkdown(String(part.content ?? "")));
      return body;
    }
    case "reasoning": {
      const details = h("details", { class: "reasoning" }, h("summary", {}, "Reasoning"));
      details.append(h("div", {}, String(part.content ?? "")));
      return details;
    }
    case "toolCall":
      return renderToolCall(part.toolCall ?? {});
    case "inputRequest": {
      const request = part.request ?? {};
      // Each answer under its question's title, as the person gave it (not as JSON).
      const titleOf = (id: string) =>
        (request.questions ?? []).find((q: JsonObject) => q.id === id)?.title ||
        (request.questions ?? []).find((q: JsonObject) => q.id === id)?.message ||
        id;
      const shown = (value: any): string =>
        Array.isArray(value) ? value.map(shown).join(", ") : value && typeof value === "object" ? shown(value.value ?? "") : String(value ?? "");
      const answers = Object.entries(request.answers ?? {}).map(([id, answer]: [string, any]) =>
        h("li", {}, h("span", { class: "question" }, `${titleOf(id)}: `), h("strong", { class: "answer" }, shown(answer?.value))),
      );
      const outcome: Record<string, string> = { accept: "answered", decline: "declined", cancel: "withdrawn" };
      const by = answeredBy.get(String(request.id ?? ""));
      return h(
        "div",
        { class: "input-request" },
        h("div", { class: "label" }, request.message ?? "The agent asked for input"),
        h("ul", {}, ...answers),
        h(
          "div",
          { class: "meta answered-by" },
          part.response ? `${outcome[part.response] ?? part.response}${by ? ` by ${by}` : ""}` : "waiting for an answer",
        ),
      );
    }
    case "error":
      // In words, never as JSON: what went wrong, and its kind in the tooltip.
      return h("div", { class: "error", title: String(part.error?.errorType ?? "") }, `The agent stopped: ${part.error?.message ?? "an error"}`);
    case "systemNotification": {
      const content = part.content;
      return h("div", { class: "system-note muted" }, typeof content === "string" ? content : String(content?.value ?? ""));
    }
    case "contentRef":
      return h("div", { class: "muted" }, `Content kept apart (${part.contentType ?? part.content_type ?? "data"}, ${part.sizeHint ?? "?"} bytes)`);
    default:
      return h("div", { class: "muted" }, `(a part this page does not show: ${String(part.kind ?? "unknown")})`);
  }
}

function renderToolCall(call: JsonObject): HTMLElement {
  const card = h("div", { class: `tool ${call.status}`, "data-tool": call.toolCallId });
  const title = call.status === "completed" && call.pastTenseMessage ? call.pastTenseMessage : call.invocationMessage || call.intention || "";
  card.append(
    h("div", { class: "tool-head" }, h("strong", {}, call.displayName || call.toolName || "tool"), ` ${title} `, h("span", { class: "badge" }, toolState(call))),
  );
  const decision = call._meta?.[DECIDED_BY];
  if ((decision?.displayName || decision?.sub) && call.status !== "pending-confirmation") {
    // The device is the client's word; the user is the relay's (it stamps `sub`); denied or approved is the
    // tool call's own state.
    const device = decision.displayName ? String(decision.displayName).split(" · ")[0] : "";
    const decidedBy = decision.sub ? (device ? `${device} · ${decision.sub}` : decision.sub) : String(decision.displayName);
    const denied = call.status === "cancelled" && (call.reason === "denied" || call.reason === "result-denied");
    card.append(h("div", { class: "decided-by" }, `${denied ? "Denied" : "Approved"} ${device ? "on" : "by"} ${decidedBy}`));
  }
  if (call.toolInput !== undefined) {
    card.append(h("div", { class: "tool-label" }, "Input"));
    card.append(h("pre", { class: "tool-input" }, typeof call.toolInput === "string" ? call.toolInput : JSON.stringify(call.toolInput, null, 2)));
  }
  if ((call.content ?? []).length > 0) card.append(h("div", { class: "tool-label" }, "Output"));
  const finished = ["completed", "cancelled"].includes(String(call.status));
  for (const item of call.content ?? []) card.append(renderToolContent(item, finished));
  if (call.error?.message) card.append(h("div", { class: "error" }, call.error.message));
  return card;
}
