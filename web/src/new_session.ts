// The new-session form's working-directory field: it names the tenant's part of the workspace (the relay's
// `defaultDirectory`), turns what the user typed into a directory URI (a name is under that root), and shows
// what is wrong next to the field.

import { pathOf } from "./labels";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

export class DirectoryField {
  /** Where this tenant's working directories may be (`initialize`'s `defaultDirectory`), if the relay says. */
  root?: string;

  /** Takes the relay's `defaultDirectory` and says it in the form. */
  setRoot(root: string | undefined): void {
    this.root = root;
    const path = root ? pathOf(root) : undefined;
    $("new-session-root").textContent = path ? `Inside ${path}/ — a name or a path under it` : "An absolute path on the runner";
    $<HTMLInputElement>("new-session-dir").placeholder = path ? "my-project (optional)" : "/path/on/the/runner (optional)";
  }

  /** The working directory the field names, as a URI: relative names are under the root. */
  resolve(): { uri?: string; error?: string } {
    const typed = $<HTMLInputElement>("new-session-dir").value.trim();
    if (!typed) return {};
    if (typed.includes("://")) return { uri: typed };
    if (typed.startsWith("/")) return { uri: `file://${typed}` };
    if (!this.root) return { error: "Give an absolute path: this relay names no workspace root." };
    const relative = typed.replace(/^\.\//, "").replace(/\/+$/, "");
    if (relative.split("/").includes("..")) return { error: "A name under the workspace may not contain '..'." };
    return { uri: `${this.root.replace(/\/+$/, "")}/${relative}` };
  }

  /** Shows `message` next to the field (or clears it); with a message the field takes the focus. */
  showError(message?: string): void {
    const field = $<HTMLInputElement>("new-session-dir");
    const error = $("new-session-error");
    error.textContent = message ?? "";
    error.hidden = !message;
    if (message) {
      field.setAttribute("aria-invalid", "true");
      field.focus();
    } else {
      field.removeAttribute("aria-invalid");
    }
  }

  clear(): void {
    $<HTMLInputElement>("new-session-dir").value = "";
  }
}
