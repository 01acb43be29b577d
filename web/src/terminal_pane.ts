// The session's terminals: those the host lists (root state `terminals`) that belong to the session or to a
// device, a new one for members (`createTerminal`: a shell in the session's sandbox, claimed by this page), shown
// in xterm.js — what it printed (the channel's state, then each `terminal/data`), what the user types
// (`terminal/input`) and its size fitted to the pane (`terminal/resized`). Viewers watch: xterm takes no input.

import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import xtermCss from "@xterm/xterm/css/xterm.css";
import { h } from "./dom";
import type { JsonObject } from "./rpc";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

/** What the pane needs of the page. */
export interface TerminalHost {
  ask(method: string, params: JsonObject): Promise<any>;
  dispatch(channel: string, action: JsonObject): void;
  subscribe(uri: string): Promise<boolean>;
  unsubscribe(uri: string): void;
  state(uri: string): JsonObject | undefined;
  rootState(): JsonObject | undefined;
  clientId(): string;
  canWrite(): boolean;
}

/** A terminal's output as one VT stream (what its content parts hold). */
function outputOf(state: JsonObject | undefined): string {
  return (state?.content ?? []).map((part: JsonObject) => (part.type === "command" ? part.output : part.value) ?? "").join("");
}

export class TerminalPane {
  private session?: string;
  private uri?: string;
  private term?: Terminal;
  private fit?: FitAddon;
  private observer?: ResizeObserver;

  constructor(private host: TerminalHost) {}

  wire(): void {
    // xterm's own rules, as a constructed style sheet (the page's CSP allows no inline <style>).
    const sheet = new CSSStyleSheet();
    sheet.replaceSync(xtermCss);
    document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
    $("terminal-new").addEventListener("click", () => void this.create());
    $("terminal-close").addEventListener("click", () => void this.dispose());
  }

  /** Show `session`'s terminals. */
  open(session: string): void {
    this.session = session;
    $<HTMLButtonElement>("terminal-new").hidden = !this.host.canWrite();
    this.renderList();
  }

  close(): void {
    this.detach();
    this.session = undefined;
  }

  /** The terminals listed for the session, oldest first. */
  private listed(): JsonObject[] {
    const terminals: JsonObject[] = this.host.rootState()?.terminals ?? [];
    return terminals.filter((info) => info.claim?.kind !== "session" || info.claim?.session === this.session);
  }

  /** The root's list moved: refresh ours. */
  renderList(): void {
    if (!this.session) return;
    const items = this.listed().map((info) => {
      const exited = info.lifecycle?.status === "exited";
      const pick = h(
        "button",
        { type: "button", class: info.resource === this.uri ? "tab active" : "tab", "data-terminal": info.resource },
        `${info.title || "Terminal"}${exited ? " (exited)" : ""}`,
      );
      pick.addEventListener("click", () => void this.attach(info.resource));
      return h("li", {}, pick);
    });
    $("terminal-list").replaceChildren(...items);
    $("terminal-empty").hidden = items.length > 0;
    $<HTMLButtonElement>("terminal-close").hidden = !this.uri || !this.host.canWrite();
  }

  /** A new shell in the session's sandbox, claimed by this page. */
  private async create(): Promise<void> {
    if (!this.session) return;
    const uri = `ahp-terminal:/${crypto.randomUUID()}`;
    const size = this.term ? { cols: this.term.cols, rows: this.term.rows } : { cols: 80, rows: 24 };
    $("terminal-status").textContent = "Starting a shell…";
    try {
      await this.host.ask("createTerminal", {
        channel: uri,
        claim: { kind: "client", clientId: this.host.clientId() },
        name: "Terminal",
        ...size,
        _meta: { "ahpRelay/session": this.session },
      });
      $("terminal-status").textContent = "";
    } catch (error) {
      $("terminal-status").textContent = `Cannot start a terminal: ${(error as Error).message}`;
      return;
    }
    await this.attach(uri);
  }

  private async dispose(): Promise<void> {
    const uri = this.uri;
    if (!uri) return;
    this.detach();
    try {
      await this.host.ask("disposeTerminal", { channel: uri });
    } catch (error) {
      $("terminal-status").textContent = `Cannot close it: ${(error as Error).message}`;
    }
    this.renderList();
  }

  /** Show terminal `uri`: its output so far, then what it prints. */
  private async attach(uri: string): Promise<void> {
    this.detach();
    this.uri = uri;
    if (!(await this.host.subscribe(uri))) return;
    const writer = this.host.canWrite();
    const term = new Terminal({ convertEol: false, disableStdin: !writer, cursorBlink: writer, fontSize: 13, scrollback: 5000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open($("terminal-screen"));
    this.term = term;
    this.fit = fit;
    term.write(outputOf(this.host.state(uri)));
    if (writer) {
      term.onData((data) => this.host.dispatch(uri, { type: "terminal/input", data }));
      // Its size follows the device holding it (a phone watching does not shrink the desktop's shell).
      term.onResize(({ cols, rows }) => {
        const claim = this.host.state(uri)?.claim;
        if (claim?.kind === "client" && claim.clientId === this.host.clientId()) {
          this.host.dispatch(uri, { type: "terminal/resized", cols, rows });
        }
      });
    }
    this.observer = new ResizeObserver(() => this.fit?.fit());
    this.observer.observe($("terminal-screen"));
    fit.fit();
    if (writer) term.focus();
    this.renderList();
  }

  private detach(): void {
    this.observer?.disconnect();
    this.term?.dispose();
    this.term = undefined;
    this.fit = undefined;
    $("terminal-screen").replaceChildren();
    if (this.uri) this.host.unsubscribe(this.uri);
    this.uri = undefined;
  }

  /** An accepted action on `channel`: what the open terminal prints. */
  onAction(channel: string, action: JsonObject): void {
    if (channel !== this.uri || !this.term) return;
    if (action.type === "terminal/data") this.term.write(String(action.data ?? ""));
    else if (action.type === "terminal/cleared") this.term.clear();
    else if (action.type === "terminal/exited") {
      this.term.write(`\r\n[the shell exited${action.exitCode === undefined ? "" : ` with ${action.exitCode}`}]\r\n`);
      this.renderList();
    }
  }

  /** The open terminal's screen and scrollback as text (for the browser test). */
  text(): string {
    const buffer = this.term?.buffer.active;
    if (!buffer) return "";
    const lines: string[] = [];
    for (let i = 0; i < buffer.length; i += 1) lines.push(buffer.getLine(i)?.translateToString(true) ?? "");
    return lines.join("\n");
  }
}
