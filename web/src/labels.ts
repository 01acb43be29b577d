// What the page says for the relay's values: session and chat statuses, tool call states, chat names and
// file paths, in words for people.

import type { JsonObject } from "./rpc";

/** The path of a `file://` URI, for people. */
export function pathOf(uri: string): string {
  const path = uri.replace(/^file:\/\//, "");
  try {
    return decodeURIComponent(path);
  } catch {
    return path;
  }
}

/** A chat's name: its title, else what it is and its place among the session's chats. */
export function chatLabel(summary: JsonObject, index: number, defaultChat: string | undefined): string {
  if (summary.title) return summary.title;
  if (summary.resource === defaultChat) return "Main chat";
  const kind = summary.origin?.kind;
  if (kind === "fork") return `Fork ${index + 1}`;
  if (kind === "sideChat") return `Side chat ${index + 1}`;
  return `Chat ${index + 1}`;
}

/** The group a session last changed at `iso` falls in, as the list shows them (local time, relative to `now`). */
export function dayGroup(iso: string | undefined, now = new Date()): string {
  const when = iso ? new Date(iso) : undefined;
  if (!when || Number.isNaN(when.getTime())) return "Older";
  const startOf = (d: Date) => new Date(d.getFullYear(), d.getMonth(), d.getDate()).getTime();
  const days = Math.round((startOf(now) - startOf(when)) / 86_400_000);
  if (days <= 0) return "Today";
  if (days === 1) return "Yesterday";
  if (days < 7) return "Previous 7 days";
  if (days < 30) return "Previous 30 days";
  return "Older";
}

/** When a session last changed, short: the time today, else the date. */
export function shortWhen(iso: string | undefined, now = new Date()): string {
  const when = iso ? new Date(iso) : undefined;
  if (!when || Number.isNaN(when.getTime())) return "";
  return dayGroup(iso, now) === "Today"
    ? when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : when.toLocaleDateString([], { day: "numeric", month: "short", ...(when.getFullYear() !== now.getFullYear() ? { year: "numeric" } : {}) });
}

export const STATUS_IDLE = 1;
export const STATUS_ERROR = 2;
export const STATUS_IN_PROGRESS = 8;
export const STATUS_INPUT_NEEDED = 24;

export function statusLabel(status: number): string {
  if ((status & STATUS_INPUT_NEEDED) === STATUS_INPUT_NEEDED) return "needs input";
  if (status & STATUS_IN_PROGRESS) return "working";
  if (status & STATUS_ERROR) return "error";
  if (status & STATUS_IDLE) return "idle";
  return "";
}

/** A tool call's state in words (a denial is not a cancellation to the person who denied it). */
export function toolState(call: JsonObject): string {
  switch (call.status) {
    case "streaming":
      return "preparing";
    case "pending-confirmation":
      return "waiting for approval";
    case "running":
      return "running";
    case "auth-required":
      return "needs sign-in";
    case "pending-result-confirmation":
      return "result waiting for approval";
    case "completed":
      return call.result?.success === false ? "failed" : "done";
    case "cancelled":
      return call.reason === "denied" || call.reason === "result-denied" ? "denied" : "skipped";
    default:
      return String(call.status ?? "");
  }
}
