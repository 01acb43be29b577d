// The session's terminals: those the host lists (root state `terminals`) that the session's agent holds, or that
// a device opened in the session (the session's `_meta["ahpRelay/terminals"]`), each labelled with the folder it
// runs in (a terminal's state says so, its `cwd`: read once per terminal); the first opens with the pane. A new one for members (`createTerminal`: a shell in the session's sandbox, claimed by this page), shown
// in xterm.js — what it printed (the channel's state, then each `terminal/data`), what the user types
// (`terminal/input`) and its size fitted to the pane (`terminal/resized`). Viewers watch: xterm takes no input.

import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import xtermCss from "@xterm/xterm/css/xterm.css";
import { h } from "./dom";
import { pathOf } from "./labels";
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
  /** The folder the open session works in (its working directory, else the tenant's workspace). */
  sessionRoot(): string | undefined;
  /** The open session's own working directory, if it has one. */
  sessionDirectory(): string | undefined;
  /** The tenant's workspace: where a terminal that names no folder runs. */
  tenantRoot(): string | undefined;
  /** The terminals devices opened in the open session, as the relay names them (undefined: it does not). */
  openedTerminals(): string[] | undefined;
}

/** Whether `dir` is `root` or inside it (both `file://` URIs or paths). */
function within(dir: string, root: string): boolean {
  const [d, r] = [pathOf(dir).replace(/\/+$/, ""), pathOf(root).replace(/\/+$/, "")];
  return d === r || d.startsWith(`${r}/`);
}

/** A folder for people: its last two names. */
function shortPlace(dir: string): string {
  return pathOf(dir).replace(/\/+$/, "").split("/").slice(-2).join("/");
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
  /** Where each device terminal runs (its state's `cwd`), once read; null while being read. */
  private places = new Map<string, string | null>();

  constructor(private host: TerminalHost) {}

  wire(): void {
    // xterm's own rules, as a constructed style sheet (the page's CSP allows no inline <style>).
    const sheet = new CSSStyleSheet();
    sheet.replaceSync(xtermCss);
    document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
    $("terminal-new").addEventListener("click", () => void this.create());
    $("terminal-close").addEventListener("click", () => void this.dispose());
  }

  /** Show `session`'s terminals, the first of them open (this device's own first). */
  open(session: string): void {
    this.session = session;
    $<HTMLButtonElement>("terminal-new").hidden = !this.host.canWrite();
    this.renderList();
    this.attachFirst();
  }

  /**
   * With no terminal open yet, open the session's first: this device's own, else one still running, else the
   * latest — once every device terminal is placed (which may be the session's).
   */
  private attachFirst(): void {
    if (this.uri || !this.session) return;
    const listed = this.listed();
    const terminals: JsonObject[] = this.host.rootState()?.terminals ?? [];
    const opened = this.host.openedTerminals();
    const mayBeOurs = (info: JsonObject) => !opened || opened.includes(info.resource);
    if (terminals.some((info) => info.claim?.kind === "client" && mayBeOurs(info) && (this.places.get(info.resource) ?? null) === null)) return;
    const own = listed.find((info) => info.claim?.kind === "client" && info.claim?.clientId === this.host.clientId());
    const first = own ?? listed.find((info) => info.lifecycle?.status !== "exited") ?? listed.at(-1);
    if (first) void this.attach(first.resource);
  }

  /** Where device terminal `uri` runs: read from its state once (subscribe, read, unsubscribe). */
  private async learnPlace(uri: string): Promise<void> {
    this.places.set(uri, null);
    try {
      const result = await this.host.ask("subscribe", { channel: uri });
      const cwd = result?.snapshot?.state?.cwd;
      this.places.set(uri, typeof cwd === "string" ? cwd : this.host.tenantRoot() ?? "");
      if (uri !== this.uri) void this.host.ask("unsubscribe", { channel: uri }).catch(() => undefined);
    } catch {
      // Unreadable (gone meanwhile): not this session's to list, and no reason to keep the pane from opening.
      this.places.set(uri, "");
    }
    this.renderList();
    this.attachFirst();
  }

  /** Where a listed terminal runs, if known. */
  private placeOf(info: JsonObject): string | undefined {
    if (info.claim?.kind === "session") return this.host.sessionRoot();
    return this.places.get(info.resource) ?? undefined;
  }

  close(): void {
    this.detach();
    this.session = undefined;
  }

  /**
   * The session's terminals, oldest first: its agent's, and devices' running in its folder (a device terminal
   * not yet placed is read, and listed once known).
   */
  private listed(): JsonObject[] {
    const terminals: JsonObject[] = this.host.rootState()?.terminals ?? [];
    // The session names the terminals devices opened in it (`_meta["ahpRelay/terminals"]`, none when missing
    // on a relay that says it names them); the folder each runs in is read for its label.
    const opened = this.host.openedTerminals();
    // A relay that does not name them: those in the session's own folder (or below it); a session without
    // one: in the tenant's workspace itself.
    const own = this.host.sessionDirectory();
    const tenant = this.host.tenantRoot();
    return terminals.filter((info) => {
      if (info.claim?.kind === "session") return info.claim?.session === this.session;
      if (opened && !opened.includes(info.resource)) return false;
      if (!this.places.has(info.resource)) void this.learnPlace(info.resource);
      const place = this.places.get(info.resource);
      if (!place) return false;
      if (opened) return true;
      return own ? within(place, own) : !!tenant && within(place, tenant) && within(tenant, place);
    });
  }

  /** The root's list moved: refresh ours. */
  renderList(): void {
    if (!this.session) return;
    const items = this.listed().map((info) => {
      const exited = info.lifecycle?.status === "exited";
      const place = this.placeOf(info);
      const pick = h(
        "button",
        {
          type: "button",
          class: info.resource === this.uri ? "tab active" : "tab",
          "data-terminal": info.resource,
          ...(place ? { title: `Runs in ${pathOf(place)}` } : {}),
        },
        `${info.title || "Terminal"}${place ? ` · ${shortPlace(place)}` : ""}${exited ? " (exited)" : ""}`,
      );
      pick.addEventListener("click", () => void this.attach(info.resource, true));
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
    await this.attach(uri, true);
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

  /**
   * Show terminal `uri`: its output so far, then what it prints; `focus` when the user picked it (a terminal
   * opened with the pane does not take the keyboard). An agent's terminal is shown read-only.
   */
  private async attach(uri: string, focus = false): Promise<void> {
    this.detach();
    this.uri = uri;
    if (!(await this.host.subscribe(uri))) return;
    const writer = this.host.canWrite() && this.host.state(uri)?.claim?.kind !== "session";
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
    if (writer && focus) term.focus();
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
