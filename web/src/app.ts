// The web client: signs in with the token from the link's fragment, keeps one connection to the relay (resumed
// with `reconnect` after a drop), and renders the host's sessions and the open chat from the model.

import { Link, LinkState, JsonObject, RpcError } from "./rpc";
import { Model, ROOT, loadReducers } from "./state";
import { renderMarkdown } from "./markdown";
import { h } from "./dom";
import { Attention } from "./attention";
import { FindInChat, SessionSearch } from "./search";
import { routeHref, routeOf, routeTo } from "./routes";
import { DirectoryField } from "./new_session";
import { ChangesPane } from "./changes_pane";
import { FilesPane } from "./files_pane";
import { TerminalPane } from "./terminal_pane";
import { Drafts } from "./drafts";
import { AUTHOR, DECIDED_BY, renderTurn } from "./turn_view";
import { confirmationCard, inputForm } from "./pending_cards";
import { STATUS_INPUT_NEEDED, chatLabel, dayGroup, pathOf, shortWhen, statusLabel } from "./labels";
import {
  askToSwitch,
  describe,
  forgetIdentity,
  forgetToken,
  identityOf,
  refusal,
  rememberIdentity,
  showSignIn,
  socketProtocols,
  takeProblem,
  takeToken,
  wireSignInForm,
} from "./signin";

const CLIENT_KEY = "ahp-relay.client-id";
const PAGE_SIZE = 30;
/** Most `listSessions` requests one search step makes while it finds nothing. */
const SEARCH_REQUESTS = 5;

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

/** Who the token says we are, for display only (the relay checks the token). */
function claims(token: string): JsonObject {
  try {
    const payload = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(payload));
  } catch {
    return {};
  }
}

function newId(): string {
  return crypto.randomUUID();
}

function clientId(): string {
  let id = sessionStorage.getItem(CLIENT_KEY);
  if (!id) {
    id = `web-${newId()}`;
    sessionStorage.setItem(CLIENT_KEY, id);
  }
  return id;
}

function deviceName(): string {
  return window.matchMedia("(max-width: 700px)").matches ? "Web (phone)" : "Web (desktop)";
}

/** The panes that take the conversation's place. */
type Pane = "files" | "changes" | "terminal";
const PANES: Pane[] = ["files", "changes", "terminal"];
const PANE_LABELS: Record<Pane, string> = { files: "Files", changes: "Changes", terminal: "Terminal" };

class App {
  private model = new Model();
  private link: Link;
  private clientSeq = 0;
  private session?: string;
  private chat?: string;
  private initialized = false;
  private renderQueued = false;
  /** The session this device is disposing (its removal is then no news to it). */
  private disposing?: string;
  /** The transcript follows its end while the user is there (and stops when they scroll up). */
  private stuck = true;
  private turnCache = new Map<string, { json: string; node: HTMLElement }>();
  /** What each rebuilt part of the page shows now (see `unchanged`). */
  private drawn = new Map<string, string>();
  private modelChoice = new Map<string, string>();
  /** Actions of this page whose outcome something waits for, by clientSeq. */
  private awaiting = new Map<number, (rejection: string | undefined) => void>();
  /** The session search under way, if any. */
  private search?: SessionSearch;
  private searchTimer?: number;
  private find = new FindInChat();
  private directory = new DirectoryField();
  private files = new FilesPane(
    (method, params) => this.link.request(method, params),
    () => this.me.role !== "viewer",
  );
  /** The pane shown in the conversation's place, if any. */
  private pane?: Pane;
  /** Whether the relay lets devices open terminals (`initialize` advertised `terminalCommandPrefix`). */
  private terminalsOn = false;
  /** The agents whose sessions hold a workspace (files, terminals, `!commands`); undefined: the relay did not say. */
  private workspaceAgents?: Set<string>;
  /** Whether this relay's sessions name the terminals devices opened in them (`_meta["ahpRelay/terminals"]`). */
  private sessionsNameTerminals = false;
  /** The agents the relay listed when it said so (an agent that came later, e.g. a runner's, is not known). */
  private agentsAtInitialize = new Set<string>();
  private changes = new ChangesPane({
    ask: (method, params) => this.link.request(method, params),
    dispatch: (channel, action) => void this.dispatch(channel, action),
    subscribe: (uri) => this.subscribe(uri),
    unsubscribe: (uri) => this.unsubscribeChannel(uri),
    state: (uri) => this.model.state(uri),
    confirm: (text, action) => this.confirmChange(text, action),
    canWrite: () => this.me.role !== "viewer",
  });
  private terminals = new TerminalPane({
    ask: (method, params) => this.link.request(method, params),
    dispatch: (channel, action) => void this.dispatch(channel, action),
    subscribe: (uri) => this.subscribe(uri),
    unsubscribe: (uri) => this.unsubscribeChannel(uri),
    state: (uri) => this.model.state(uri),
    rootState: () => this.model.state(ROOT),
    clientId: () => clientId(),
    canWrite: () => this.me.role !== "viewer",
    sessionRoot: () => this.sessionRoot(),
    sessionDirectory: () => (this.session ? this.model.state(this.session)?.workingDirectories?.[0] : undefined),
    tenantRoot: () => this.directory.root,
    // Read only where the relay says it keeps the list (a relay that does not may hold a stale one).
    openedTerminals: () => {
      if (!this.sessionsNameTerminals) return undefined;
      const named = this.session ? this.model.state(this.session)?._meta?.["ahpRelay/terminals"] : undefined;
      return Array.isArray(named) ? named.map(String) : [];
    },
  });
  private me: JsonObject;
  /** Whether the connection is up (approvals and answers wait while it is not). */
  private online = false;
  /** Focus the opened session's message box (or its title) once it is drawn. */
  private focusOnRender = false;
  /** The running turn the screen reader is to hear the end of, and whether it heard that it needs input. */
  private watched?: { chat: string; turn: string; askedInput: boolean };
  /** A touch keyboard: Return makes a new line, the Send button sends. */
  private touch = window.matchMedia("(pointer: coarse)").matches || navigator.maxTouchPoints > 0;
  /** What the user typed in each chat's message box, kept and synced per chat. */
  private drafts: Drafts;
  private attention = new Attention(
    (summary) => statusLabel(summary.status ?? 0) === "needs input",
    () => this.session,
    (session) => void this.openSession(session),
  );

  constructor(private token: string) {
    this.me = claims(token);
    this.drafts = new Drafts({ sub: String(this.me.sub ?? ""), tid: String(this.me.tid ?? "") }, (chat, draft) => {
      if (this.me.role === "viewer" || !this.link.online) return false;
      this.clientSeq += 1;
      return this.link.notify("dispatchAction", {
        channel: chat,
        clientSeq: this.clientSeq,
        action: draft ? { type: "chat/draftChanged", draft } : { type: "chat/draftChanged" },
      });
    });
    const url = new URL(location.href);
    const host = new URLSearchParams(location.hash.slice(1)).get("host");
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    url.pathname = host ? `/v1/hosts/${encodeURIComponent(host)}/ws` : "/v1/ws";
    url.hash = "";
    url.search = "";
    // The token rides in the handshake's Sec-WebSocket-Protocol, never in the URL (which proxies and the
    // console log).
    this.link = new Link(url.href, socketProtocols(token), {
      opened: (link) => this.handshake(link),
      notification: (method, params) => this.onNotification(method, params),
      state: (state) => this.showLinkState(state),
      refused: () => refusal(token, host),
    });
  }

  start(): void {
    // Who and which tenant: a tab signed in as someone else is plain to see.
    const identity = identityOf(this.token);
    // On a phone the role goes and "of tenant" shortens to "·", so the user and the tenant both fit.
    if (identity) {
      $("who").replaceChildren(
        h("span", { class: "who-user" }, identity.sub),
        h("span", { class: "who-role" }, ` (${identity.role})`),
        h("span", { class: "who-dot", "aria-hidden": "true" }, " · "),
        h("span", { class: "who-of" }, " of tenant "),
        h("span", { class: "who-tenant" }, identity.tid),
      );
    } else $("who").textContent = "?";
    $("who").title = identity ? describe(identity) : "";
    // A link's token that was not taken (the tab kept its own): said once, in the notes.
    if (takeProblem) this.note(takeProblem);
    this.warnBeforeExpiry();
    this.attention.wire();
    $("sign-out").hidden = false;
    $("sign-out").addEventListener("click", () => {
      forgetToken();
      // Signing out on purpose (not an expiry): this user's drafts and name leave this browser.
      this.drafts.flushAll();
      this.drafts.forgetAll();
      forgetIdentity();
      this.link.stop();
      $("sign-out").hidden = true;
      void showSignIn("You signed out.");
    });
    // A viewer watches: the controls the relay would refuse (create, send, answer, dispose) are hidden.
    document.body.dataset.role = String(this.me.role ?? "");
    $("view-only").hidden = this.me.role !== "viewer";
    $("new-session").addEventListener("submit", (event) => {
      event.preventDefault();
      void this.createSession();
    });
    $("new-session-agent").addEventListener("change", () => this.fillModels());
    // On a phone the form is folded away until asked for.
    $("new-session-toggle").addEventListener("click", () => {
      const open = $("new-session").classList.toggle("open");
      $("new-session-toggle").setAttribute("aria-expanded", String(open));
      if (open) $("new-session-agent").focus();
    });
    // A touch keyboard has no Shift+Enter to speak of: its hint is only for keyboards.
    if (this.touch) {
      $<HTMLTextAreaElement>("prompt").placeholder = "Message the agent";
    }
    $("more-sessions").addEventListener("click", () => void (this.search ? this.searchMore() : this.loadSessions(false)));
    $("session-search").addEventListener("input", () => {
      window.clearTimeout(this.searchTimer);
      this.searchTimer = window.setTimeout(() => void this.startSearch(), 200);
    });
    $("find-in-chat").addEventListener("input", () => {
      this.find.reset($<HTMLInputElement>("find-in-chat").value.trim());
      this.showFind();
    });
    $("find-in-chat").addEventListener("keydown", (event) => {
      if (event.key !== "Enter") return;
      event.preventDefault();
      this.stuck = false;
      this.find.step($("transcript"), event.shiftKey);
      this.showFind();
    });
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    $("prompt").addEventListener("keydown", (event) => {
      // On a touch keyboard Return is a new line (a message may have several); Send sends.
      if (event.key === "Enter" && !event.shiftKey && !this.touch && !event.isComposing) {
        event.preventDefault();
        this.send();
      }
    });
    // What is typed stays with its chat (kept here at once, synced to the user's other devices after a pause).
    $("prompt").addEventListener("input", () => {
      if (this.chat) this.drafts.typed(this.chat, $<HTMLTextAreaElement>("prompt").value);
      this.commandHint();
    });
    window.addEventListener("pagehide", () => this.drafts.flushAll());
    // Sharing drafts across devices is the user's choice (the chat's one draft slot is seen by its members).
    const share = $<HTMLInputElement>("share-drafts");
    share.checked = this.drafts.sharing;
    share.addEventListener("change", () => {
      this.drafts.sharing = share.checked;
      const box = $<HTMLTextAreaElement>("prompt");
      if (!share.checked || !this.chat) return;
      // Turned on: an empty box takes this user's draft from another device; a typed one is shared.
      if (!box.value) box.value = this.drafts.initial(this.chat, this.chatState());
      else this.drafts.typed(this.chat, box.value);
    });
    $("cancel").addEventListener("click", () => this.cancelTurn());
    $("dispose-session").addEventListener("click", () => void this.disposeSession());
    $("session-details").addEventListener("click", () => {
      const open = document.body.classList.toggle("details-open");
      $("session-details").setAttribute("aria-expanded", String(open));
    });
    // Rename in place: the title becomes a field; Enter keeps it (for every device), Escape or leaving it does not.
    $("rename-session-start").addEventListener("click", () => this.startRename());
    $("rename-session").addEventListener("submit", (event) => {
      event.preventDefault();
      this.finishRename(true);
    });
    $("rename-session-title").addEventListener("keydown", (event) => {
      if (event.key === "Escape") this.finishRename(false);
    });
    $("rename-session-title").addEventListener("blur", () => this.finishRename(false));
    $("new-chat").addEventListener("click", () => void this.createChat());
    // The skip link moves the keyboard to the message box; followed as a link it would put "#prompt" in the
    // address, which names the open session and chat.
    $("skip-to-prompt").addEventListener("click", (event) => {
      event.preventDefault();
      const box = $<HTMLTextAreaElement>("prompt");
      box.scrollIntoView({ block: "nearest" });
      box.focus();
    });
    // The session's files, in place of the conversation while open.
    this.files.wire();
    this.changes.wire();
    this.terminals.wire();
    for (const pane of PANES) $(`${pane}-toggle`).addEventListener("click", () => void this.togglePane(pane));
    $("back").addEventListener("click", () => this.closeSession());
    // The browser knows before the socket does: treat "offline" as a dropped connection, "online" as a cue
    // to reconnect now rather than after the back-off.
    window.addEventListener("offline", () => this.link.drop());
    window.addEventListener("online", () => this.link.retryNow());
    // A transcript that follows: it stays at its end while the user is there, whatever grows (a reply, a
    // card below it that takes its room); scrolled up, a button offers the way back.
    const transcript = $("transcript");
    transcript.addEventListener("scroll", () => {
      this.stuck = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 24;
      if (this.stuck) $("jump-latest").hidden = true;
    });
    new ResizeObserver(() => this.follow()).observe(transcript);
    new MutationObserver(() => this.follow()).observe(transcript, {
      subtree: true,
      childList: true,
      characterData: true,
    });
    $("jump-latest").addEventListener("click", () => {
      this.stuck = true;
      this.follow();
    });
    // Back and Forward move between the places the address bar named.
    window.addEventListener("popstate", () => void this.followRoute());
    // Read-only inspection from the console (and the browser test): the open chat's reduced state.
    (globalThis as any).ahpRelay = {
      chat: () => this.chat,
      session: () => this.session,
      state: (uri: string) => this.model.state(uri),
      lastSeenServerSeq: () => this.model.lastSeen,
      terminalText: () => this.terminals.text(),
      // The session list's groups (for the browser test): which `iso` falls in, seen from `now`.
      dayGroup: (iso: string, now: Date) => dayGroup(iso, now),
      // What the page's Markdown renderer makes of `source`: its text and the elements it created.
      markdown: (source: string) => {
        const fragment = renderMarkdown(source);
        return {
          text: fragment.textContent,
          tags: [...new Set([...fragment.querySelectorAll("*")].map((e) => e.tagName.toLowerCase()))],
        };
      },
    };
    this.link.start();
  }

  /** Five minutes before the token expires (or now, when it has less left), the header says when it ends. */
  private warnBeforeExpiry(): void {
    const exp = Number(this.me.exp ?? 0) * 1000;
    if (!exp) return;
    const show = () => {
      const left = Math.max(0, Math.round((exp - Date.now()) / 60_000));
      const at = new Date(exp).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
      const warning = $("expiry-warning");
      warning.textContent = `Your sign-in ends at ${at} (${left < 1 ? "in less than a minute" : `in ${left} min`}): sign in again then; what you typed is kept.`;
      warning.hidden = false;
    };
    const warnIn = exp - 5 * 60_000 - Date.now();
    if (warnIn <= 0) show();
    else if (warnIn < 2 ** 31 - 1) window.setTimeout(show, warnIn);
  }

  // ── connection ──────────────────────────────────────────────────────────────────────────────────────

  /** A fresh socket: resume with `reconnect` from the last serverSeq, or start with `initialize`. */
  private async handshake(link: Link): Promise<void> {
    if (this.initialized) {
      try {
        const result = await link.request("reconnect", {
          channel: ROOT,
          clientId: clientId(),
          lastSeenServerSeq: this.model.lastSeen,
          subscriptions: this.model.channels(),
        });
        if (result.type === "replay") {
          for (const envelope of result.actions ?? []) this.model.applyEnvelope(envelope);
          for (const gone of result.missing ?? []) this.channelGone(gone);
        } else {
          for (const snapshot of result.snapshots ?? []) this.model.applySnapshot(snapshot);
        }
        // A chat closed while this page was away is left now.
        this.leaveClosedChat();
        this.note("Back online: caught up with what happened meanwhile", `resumed from serverSeq ${this.model.lastSeen}`);
        await this.loadSessions(true);
        this.announcePresence();
        this.render();
        return;
      } catch (error) {
        if (!(error instanceof RpcError)) throw error;
        this.note("Back online: reloaded everything (could not catch up)", error.message);
      }
    }
    const result = await link.request("initialize", {
      channel: ROOT,
      protocolVersions: ["1.0.0"],
      clientId: clientId(),
      initialSubscriptions: [ROOT],
    });
    this.model.saw(Number(result.serverSeq ?? 0));
    this.directory.setRoot(typeof result.defaultDirectory === "string" ? result.defaultDirectory : undefined);
    this.terminalsOn = typeof result.terminalCommandPrefix === "string";
    const workspaceAgents = result._meta?.["ahpRelay/workspaceAgents"];
    this.workspaceAgents = Array.isArray(workspaceAgents) ? new Set(workspaceAgents.map(String)) : undefined;
    this.sessionsNameTerminals = result._meta?.["ahpRelay/sessionsNameTerminals"] === true;
    this.agentsAtInitialize = new Set(
      (result.snapshots ?? []).flatMap((s: JsonObject) => (s.state?.agents ?? []).map((a: JsonObject) => String(a.provider))),
    );
    for (const snapshot of result.snapshots ?? []) this.model.applySnapshot(snapshot);
    const first = !this.initialized;
    this.initialized = true;
    this.fillAgents();
    await this.loadSessions(true);
    for (const uri of [this.session, this.chat]) {
      if (uri) await this.subscribe(uri);
    }
    this.announcePresence();
    this.render();
    // The first time in: open what the address names (a reload, a bookmark, a shared link).
    if (first) await this.followRoute();
  }

  /** Open the session and chat the address bar names (or the list when it names none). */
  private async followRoute(): Promise<void> {
    const route = routeOf();
    if (!route.session) {
      if (this.session) {
        this.leave();
        document.body.dataset.view = "sessions";
        this.render();
      }
      return;
    }
    if (route.session !== this.session) await this.openSession(route.session, route.chat, true);
    else if (route.chat && route.chat !== this.chat) await this.openChat(route.chat, true);
  }

  /** The connection in words; the details (close codes, the relay's reason) in the pill's tooltip. */
  private showLinkState(state: LinkState): void {
    const pill = $("link-state");
    pill.dataset.state = state.kind;
    pill.textContent =
      state.kind === "online"
        ? "Connected"
        : state.kind === "connecting"
          ? state.attempt > 1
            ? "Reconnecting…"
            : "Connecting…"
          : state.kind === "offline"
            ? `${state.reason}, retrying in ${Math.max(1, Math.round(state.retryInMs / 1000))} s`
            : /expired/i.test(state.reason)
              ? "Sign-in expired"
              : "Sign-in refused";
    pill.title =
      state.kind === "offline" || state.kind === "refused"
        ? state.detail
        : state.kind === "connecting"
          ? `attempt ${state.attempt}`
          : "";
    $("composer-send").toggleAttribute("disabled", state.kind !== "online");
    this.online = state.kind === "online";
    this.markPending();
    if (state.kind === "online") {
      // The relay took the token: this browser remembers who it is, to ask before a link signs in someone else.
      const identity = identityOf(this.token);
      if (identity) rememberIdentity(identity);
    }
    if (state.kind === "refused") {
      // Retrying cannot help. A token that is no good is forgotten (a reload must not retry it); one refused
      // only for this host is kept (the address is what is wrong).
      if (state.forget) forgetToken();
      $("sign-out").hidden = true;
      void showSignIn(state.reason, state.detail);
    }
  }

  private onNotification(method: string, params: JsonObject): void {
    if (method === "action") {
      if (params.origin?.clientId === clientId()) {
        if (params.rejectionReason) this.note(`not applied: ${params.rejectionReason}`);
        const waiting = this.awaiting.get(Number(params.origin.clientSeq));
        if (waiting) {
          this.awaiting.delete(Number(params.origin.clientSeq));
          waiting(params.rejectionReason ?? undefined);
        }
      }
      if (this.model.applyEnvelope(params)) {
        if (this.changes.shows(params.channel)) this.changes.render();
        this.terminals.onAction(params.channel, params.action ?? {});
        if (params.channel === ROOT || (params.channel === this.session && params.action?.type === "session/metaChanged")) this.terminals.renderList();
        // The open chat closed (here or on another device): only its removal says so (a chat this page just
        // created may not be listed yet).
        if (params.channel === this.session && params.action?.type === "session/chatRemoved" && params.action?.chat === this.chat) {
          this.leaveClosedChat();
        }
        if (params.channel === this.session) {
          this.followDefaultChat();
        }
        this.render();
      }
    } else if (this.model.onRootNotification(method, params)) {
      this.attention.observe(this.model.sessionList());
      if (method === "root/sessionRemoved" && params.session === this.session) {
        // Disposed elsewhere: say so, rather than leaving the user wondering where it went.
        if (this.disposing !== params.session) {
          const title = this.model.state(params.session)?.title || "the open session";
          this.note(`"${title}" was disposed on another device`);
        }
        this.closeSession();
      }
      this.render();
    }
  }

  /** Sends `action`; returns its clientSeq, or `undefined` when offline (not sent). */
  private dispatch(channel: string, action: JsonObject): number | undefined {
    this.clientSeq += 1;
    if (!this.link.notify("dispatchAction", { channel, clientSeq: this.clientSeq, action })) {
      this.note("offline: the action was not sent");
      return undefined;
    }
    return this.clientSeq;
  }

  /** Sends `action` and waits for the relay's answer: `undefined` once applied, else why it was not. */
  private dispatchAndWait(channel: string, action: JsonObject): Promise<string | undefined> {
    const seq = this.dispatch(channel, action);
    if (seq === undefined) return Promise.resolve("offline: not sent");
    return new Promise((resolve) => {
      const timer = window.setTimeout(() => {
        this.awaiting.delete(seq);
        resolve("the relay did not answer in time");
      }, 10_000);
      this.awaiting.set(seq, (rejection) => {
        window.clearTimeout(timer);
        resolve(rejection);
      });
    });
  }

  private async subscribe(uri: string): Promise<boolean> {
    this.model.expect(uri);
    try {
      const result = await this.link.request("subscribe", { channel: uri });
      if (result.snapshot) this.model.applySnapshot(result.snapshot);
      return true;
    } catch (error) {
      this.model.forget(uri);
      this.note(`could not open ${uri}: ${(error as Error).message}`);
      return false;
    }
  }

  private channelGone(uri: string): void {
    this.model.forget(uri);
    if (uri === this.session) this.closeSession();
    if (uri === this.chat) this.chat = undefined;
  }

  /** A line in the notes: `text` for a person, `detail` (numbers, codes) in its tooltip. */
  private note(text: string, detail?: string): void {
    const line = h("li", detail ? { title: detail } : {}, `${new Date().toLocaleTimeString()} ${text}`);
    const log = $("notes");
    log.prepend(line);
    while (log.childElementCount > 5) log.lastElementChild?.remove();
  }

  // ── sessions ────────────────────────────────────────────────────────────────────────────────────────

  private async loadSessions(first: boolean): Promise<void> {
    const params: JsonObject = { channel: ROOT, limit: PAGE_SIZE };
    if (!first && this.model.nextCursor) params.cursor = this.model.nextCursor;
    const page = await this.link.request("listSessions", params);
    if (first) this.model.sessions.clear();
    for (const item of page.items ?? []) this.model.sessions.set(item.resource, item);
    this.model.nextCursor = page.nextCursor ?? undefined;
    this.attention.observe(this.model.sessionList());
    this.render();
  }

  /** Search the catalogue for the query in the search box (the whole list again when it is empty). */
  private async startSearch(): Promise<void> {
    const query = $<HTMLInputElement>("session-search").value.trim();
    if (!query) {
      this.search = undefined;
      this.render();
      return;
    }
    const search = new SessionSearch(query);
    this.search = search;
    await this.searchMore(search);
  }

  private async searchMore(search = this.search): Promise<void> {
    if (!search) return;
    try {
      // The relay scans a bounded part of the catalogue a request: go on while it found nothing yet and has
      // more to scan (a few requests at most before the user is shown the "more" button).
      for (let asked = 0; asked < SEARCH_REQUESTS; asked++) {
        const before = search.items.size;
        const page = await this.link.request("listSessions", search.params(PAGE_SIZE, ROOT));
        if (this.search !== search) return;
        search.add(page);
        if (search.items.size > before || !search.cursor) break;
      }
    } catch (error) {
      this.note(`could not search: ${(error as Error).message}`);
    }
    this.render();
  }

  /** Marks what the find box looks for in the transcript and says how many there are. */
  private showFind(): void {
    const count = this.find.mark($("transcript"));
    const place = this.find.place;
    $("find-count").textContent = !this.find.query
      ? ""
      : count === 0
        ? "no match"
        : place > 0
          ? `${place} of ${count}`
          : `${count} match${count === 1 ? "" : "es"}`;
  }

  private fillAgents(): void {
    const root = this.model.state(ROOT);
    const select = $<HTMLSelectElement>("new-session-agent");
    select.replaceChildren(
      ...(root?.agents ?? []).map((agent: JsonObject) =>
        h("option", { value: agent.provider }, agent.displayName || agent.provider),
      ),
    );
    this.fillModels();
  }

  private fillModels(): void {
    const root = this.model.state(ROOT);
    const provider = $<HTMLSelectElement>("new-session-agent").value;
    const agent = (root?.agents ?? []).find((a: JsonObject) => a.provider === provider);
    $<HTMLSelectElement>("new-session-model").replaceChildren(
      h("option", { value: "" }, "default model"),
      ...(agent?.models ?? []).map((m: JsonObject) => h("option", { value: m.id }, m.name || m.id)),
    );
  }

  private async createSession(): Promise<void> {
    const uri = `ahp-session:/${newId()}`;
    const provider = $<HTMLSelectElement>("new-session-agent").value;
    const model = $<HTMLSelectElement>("new-session-model").value;
    const directory = this.directory.resolve();
    this.directory.showError(directory.error);
    if (directory.error) return;
    const params: JsonObject = { channel: uri, provider };
    if (directory.uri) params.workingDirectories = [directory.uri];
    try {
      // The session starts with its default chat, which opening it shows.
      await this.link.request("createSession", params);
    } catch (error) {
      // The relay refuses a directory outside the tenant's workspace: said next to the field.
      const message = (error as Error).message;
      if (directory.uri && /directory/i.test(message)) {
        this.directory.showError(message);
      } else {
        this.note(`could not create a session: ${message}`);
      }
      return;
    }
    this.directory.clear();
    if (model) this.modelChoice.set(uri, model);
    await this.openSession(uri);
  }

  /** Open session `uri` and `chat` (else its default chat); `following` when the address bar already says so. */
  private async openSession(uri: string, chat?: string, following = false): Promise<void> {
    if (this.session && this.session !== uri) this.leave();
    this.session = uri;
    if (!following) routeTo(uri, undefined, false);
    document.body.dataset.view = "session";
    if (!(await this.subscribe(uri))) return;
    if (chat) await this.openChat(chat, true);
    else this.followDefaultChat();
    this.announcePresence();
    this.focusOnRender = true;
    this.render();
  }

  /** Opens the session's default chat (else its first) when no chat is open, e.g. once a new session has one. */
  private followDefaultChat(): void {
    const state = this.session ? this.model.state(this.session) : undefined;
    const chat = state?.defaultChat ?? state?.chats?.[0]?.resource;
    if (chat && !this.chat) void this.openChat(chat);
  }

  private async openChat(uri: string, following = false): Promise<void> {
    if (this.chat === uri) return;
    // Opening the session's chat completes its address (in place); switching chats is a step of its own.
    if (!following) routeTo(this.session, uri, !routeOf().chat);
    if (this.chat) {
      this.drafts.flush(this.chat);
      void this.link.request("unsubscribe", { channel: this.chat }).catch(() => undefined);
      this.model.forget(this.chat);
    }
    this.chat = uri;
    // A turn already running when the chat opens is heard ending too; older ones are not.
    this.watched = undefined;
    // Nothing typed for another chat may be sent to this one.
    $<HTMLTextAreaElement>("prompt").value = "";
    this.turnCache.clear();
    this.stuck = true;
    $("jump-latest").hidden = true;
    $("transcript").replaceChildren();
    await this.subscribe(uri);
    if (this.chat === uri) $<HTMLTextAreaElement>("prompt").value = this.drafts.initial(uri, this.model.state(uri));
    this.render();
  }

  private leave(): void {
    this.showPane(undefined);
    if (this.chat) this.drafts.flush(this.chat);
    $<HTMLTextAreaElement>("prompt").value = "";
    for (const uri of [this.chat, this.session]) {
      if (!uri) continue;
      void this.link.request("unsubscribe", { channel: uri }).catch(() => undefined);
      this.model.forget(uri);
    }
    this.session = undefined;
    this.chat = undefined;
    this.turnCache.clear();
    $("transcript").replaceChildren();
  }

  private closeSession(): void {
    this.leave();
    routeTo(undefined, undefined, false);
    document.body.dataset.view = "sessions";
    this.render();
  }

  private async createChat(): Promise<void> {
    if (!this.session) return;
    const chat = `ahp-chat:/${newId()}`;
    try {
      await this.link.request("createChat", { channel: this.session, chat });
      await this.openChat(chat);
    } catch (error) {
      this.note(`could not create a chat: ${(error as Error).message}`);
    }
  }

  private startRename(): void {
    const session = this.session ? this.model.state(this.session) : undefined;
    if (!session) return;
    const field = $<HTMLInputElement>("rename-session-title");
    field.value = session.title || "";
    $("rename-session").hidden = false;
    $("session-title").hidden = true;
    $("rename-session-start").hidden = true;
    field.focus();
    field.select();
  }

  /** Leave the title field; `keep` renames the session (`session/titleChanged`, seen by every device). */
  private finishRename(keep: boolean): void {
    if ($("rename-session").hidden) return;
    const title = $<HTMLInputElement>("rename-session-title").value.trim();
    $("rename-session").hidden = true;
    $("session-title").hidden = false;
    $("rename-session-start").hidden = false;
    const current = this.session ? this.model.state(this.session)?.title : undefined;
    if (keep && this.session && title && title !== current) {
      this.dispatch(this.session, { type: "session/titleChanged", title });
    }
  }

  /** The folder the session works in: its working directory, else the tenant's part of the workspace. */
  private sessionRoot(): string | undefined {
    const session = this.session ? this.model.state(this.session) : undefined;
    return session?.workingDirectories?.[0] ?? this.directory.root;
  }

  /** Open or close one of the session's panes (files, changes, terminals): it takes the conversation's place. */
  private async togglePane(pane: Pane): Promise<void> {
    const open = this.pane !== pane;
    this.showPane(open ? pane : undefined);
    if (!open || !this.session) return;
    if (pane === "files") {
      const root = this.sessionRoot();
      if (root) await this.files.open(root);
    } else if (pane === "changes") {
      const session = this.model.state(this.session);
      if (session) await this.changes.open(session, this.lastTurnId());
    } else {
      this.terminals.open(this.session);
    }
  }

  private showPane(pane: Pane | undefined): void {
    if (this.pane === "changes" && pane !== "changes") this.changes.close();
    if (this.pane === "terminal" && pane !== "terminal") this.terminals.close();
    this.pane = pane;
    document.body.classList.toggle("files-open", pane !== undefined);
    for (const name of PANES) {
      $(`${name}-pane`).hidden = pane !== name;
      $(`${name}-toggle`).textContent = pane === name ? "Chat" : PANE_LABELS[name];
      $(`${name}-toggle`).setAttribute("aria-expanded", String(pane === name));
    }
  }

  /** The open chat's latest turn (what "This turn's changes" shows). */
  private lastTurnId(): string | undefined {
    const chat = this.chat ? this.model.state(this.chat) : undefined;
    return chat?.activeTurn?.id ?? chat?.turns?.at(-1)?.id;
  }

  private unsubscribeChannel(uri: string): void {
    void this.link.request("unsubscribe", { channel: uri }).catch(() => undefined);
    this.model.forget(uri);
  }

  /** Asks the user to confirm a destructive change (`text`, the relay's words); whether they did. */
  private async confirmChange(text: string, action: string): Promise<boolean> {
    $("confirm-change-text").textContent = text;
    $("confirm-change-ok").textContent = action;
    return (await this.ask($<HTMLDialogElement>("confirm-change"))) === "ok";
  }

  /** Asks in `dialog` (its buttons' values); resolves with the value of the button pressed. */
  private ask(dialog: HTMLDialogElement): Promise<string> {
    return new Promise<string>((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue), { once: true });
      dialog.returnValue = "cancel";
      dialog.showModal();
    });
  }

  /** Close (dispose) chat `uri` of the open session for every device, once the user confirmed it. */
  private async closeChat(uri: string, label: string): Promise<void> {
    const dialog = $<HTMLDialogElement>("confirm-close-chat");
    $("confirm-close-chat-name").textContent = label;
    if ((await this.ask(dialog)) !== "close") return;
    try {
      await this.link.request("disposeChat", { channel: uri });
    } catch (error) {
      this.note(`could not close the chat: ${(error as Error).message}`);
    }
  }

  /** The open chat left its session (closed here or on another device): show the session's default chat. */
  private leaveClosedChat(): void {
    const session = this.session ? this.model.state(this.session) : undefined;
    if (!session || !this.chat || (session.chats ?? []).some((c: JsonObject) => c.resource === this.chat)) return;
    this.model.forget(this.chat);
    this.chat = undefined;
    this.turnCache.clear();
    $("transcript").replaceChildren();
    routeTo(this.session, undefined, true);
    this.followDefaultChat();
  }

  /** Dispose the open session, once the user confirmed it in the dialog (it ends for every device). */
  private async disposeSession(): Promise<void> {
    if (!this.session) return;
    const uri = this.session;
    const answer = await this.ask($<HTMLDialogElement>("confirm-dispose"));
    if (answer !== "dispose" || this.session !== uri) return;
    try {
      this.disposing = uri;
      await this.link.request("disposeSession", { channel: uri });
      this.closeSession();
    } catch (error) {
      this.note(`could not dispose: ${(error as Error).message}`);
    } finally {
      this.disposing = undefined;
    }
  }

  /** Shows this device in the session's active clients (so other devices see who is connected). */
  private announcePresence(): void {
    // A viewer says it is watching too (offering no tools): every device lists who is there.
    if (!this.session) return;
    const state = this.model.state(this.session);
    if (!state || (state.activeClients ?? []).some((c: JsonObject) => c.clientId === clientId())) return;
    this.dispatch(this.session, {
      type: "session/activeClientSet",
      activeClient: {
        clientId: clientId(),
        displayName: `${deviceName()} · ${this.me.sub ?? ""}${this.me.role === "viewer" ? " (watching)" : ""}`,
        tools: [],
      },
    });
  }

  // ── chat actions ────────────────────────────────────────────────────────────────────────────────────

  private chatState(): JsonObject | undefined {
    return this.chat ? this.model.state(this.chat) : undefined;
  }

  private send(): void {
    const box = $<HTMLTextAreaElement>("prompt");
    const text = box.value.trim();
    const chat = this.chat;
    if (!text || !chat || !this.link.online) return;
    const message: JsonObject = { text, origin: { kind: "user" } };
    const model = this.session && this.modelChoice.get(this.session);
    if (model) message.model = { id: model };
    if (this.chatState()?.activeTurn) {
      this.dispatch(chat, { type: "chat/pendingMessageSet", kind: "queued", id: newId(), message });
    } else {
      this.dispatch(chat, { type: "chat/turnStarted", turnId: newId(), startedAt: new Date().toISOString(), message });
    }
    box.value = "";
    this.drafts.sent(chat, this.chatState());
  }

  /** Edit a sent prompt in place; sending it replaces that turn and every later one (truncate + resend). */
  private startEdit(node: HTMLElement, prompt: HTMLElement, text: string, before: string | undefined): void {
    const box = h("textarea", { class: "edit-box", "aria-label": "Edited prompt", rows: "3" }) as HTMLTextAreaElement;
    box.value = text;
    const send = h("button", { type: "button", class: "send-edit" }, "Send");
    const cancel = h("button", { type: "button", class: "link" }, "Cancel");
    const editor = h("div", { class: "editor" }, box, h("div", { class: "actions" }, send, cancel));
    prompt.replaceWith(editor);
    node.querySelector(".prompt-actions")?.setAttribute("hidden", "");
    box.focus();
    cancel.addEventListener("click", () => {
      editor.replaceWith(prompt);
      node.querySelector(".prompt-actions")?.removeAttribute("hidden");
    });
    const go = () => {
      const edited = box.value.trim();
      if (edited) void this.branch(before, { text: edited, origin: { kind: "user" } });
    };
    send.addEventListener("click", go);
    // As in the message box: Enter sends, Shift+Enter (or Return on a touch keyboard) makes a new line.
    box.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !this.touch && !event.isComposing) {
        event.preventDefault();
        go();
      } else if (event.key === "Escape") cancel.click();
    });
  }

  /** What the open session's agent can do with chats: fork them, or hold several. */
  private chatAbilities(): { fork: boolean; chats: boolean } {
    const session = this.session ? this.model.state(this.session) : undefined;
    const agent = (this.model.state(ROOT)?.agents ?? []).find((a: JsonObject) => a.provider === session?.provider);
    const multiple = agent?.capabilities?.multipleChats;
    return { fork: !!multiple?.fork, chats: !!multiple };
  }

  /**
   * An edit or a retry of the turn after `before` (the chat's first when undefined) runs `message` on a branch:
   * a new chat forked through `before` (or a new chat, for the first turn), and the original chat keeps every
   * turn. An agent that cannot hold another chat replaces the turns instead, once the user confirmed how many go.
   */
  private async branch(before: string | undefined, message: JsonObject): Promise<void> {
    const chat = this.chat;
    const session = this.session;
    if (!chat || !session || this.chatState()?.activeTurn || !this.link.online) return;
    const can = this.chatAbilities();
    if ((before && can.fork) || (!before && can.chats)) {
      const next: JsonObject = { ...message, origin: message.origin ?? { kind: "user" } };
      const model = this.modelChoice.get(session);
      if (model && !next.model) next.model = { id: model };
      const created = `ahp-chat:/${newId()}`;
      const params: JsonObject = { channel: session, chat: created, initialMessage: next };
      if (before) params.source = { kind: "fork", chat, turnId: before };
      try {
        await this.link.request("createChat", params);
      } catch (error) {
        this.note(`could not branch the chat: ${(error as Error).message}`);
        return;
      }
      this.note("Sent on a new branch; the earlier chat keeps its turns");
      await this.openChat(created);
      return;
    }
    const turns: JsonObject[] = this.chatState()?.turns ?? [];
    const from = before ? turns.findIndex((t) => t.id === before) + 1 : 0;
    const going = turns.length - from;
    $("confirm-truncate-text").textContent =
      `${can.chats ? "This agent cannot fork a chat" : "This agent keeps one chat"}, so ${going} turn${going === 1 ? "" : "s"} (this one${going > 1 ? " and every later one" : ""}) ` +
      "will be removed for everyone in the session, and your message sent in their place.";
    $("confirm-truncate-ok").textContent = `Replace ${going} turn${going === 1 ? "" : "s"}`;
    if ((await this.ask($<HTMLDialogElement>("confirm-truncate"))) !== "ok") return;
    await this.resend(before, message);
  }

  /** A new chat continuing the open one through `turnId` (its turns copied), opened here. */
  private async fork(turnId: string): Promise<void> {
    const chat = this.chat;
    const session = this.session;
    if (!chat || !session) return;
    const created = `ahp-chat:/${newId()}`;
    try {
      await this.link.request("createChat", { channel: session, chat: created, source: { kind: "fork", chat, turnId } });
    } catch (error) {
      this.note(`could not fork the chat: ${(error as Error).message}`);
      return;
    }
    await this.openChat(created);
  }

  /**
   * Drop the turns after `before` (all, when undefined) and send `message` as a new turn (AHP: `chat/truncated`
   * then `chat/turnStarted`). Both go in order on the one connection.
   */
  private async resend(before: string | undefined, message: JsonObject): Promise<void> {
    const chat = this.chat;
    if (!chat || this.chatState()?.activeTurn || !this.link.online) return;
    // The new turn goes only once the truncation is applied (refused, it would land after the old turns).
    const refused = await this.dispatchAndWait(chat, before ? { type: "chat/truncated", turnId: before } : { type: "chat/truncated" });
    if (refused !== undefined || this.chat !== chat) return;
    const next: JsonObject = { ...message, origin: message.origin ?? { kind: "user" } };
    const model = this.session && this.modelChoice.get(this.session);
    if (model && !next.model) next.model = { id: model };
    this.dispatch(chat, { type: "chat/turnStarted", turnId: newId(), startedAt: new Date().toISOString(), message: next });
    this.stuck = true;
  }

  private cancelTurn(): void {
    const turn = this.chatState()?.activeTurn;
    if (turn && this.chat) this.dispatch(this.chat, { type: "chat/turnCancelled", turnId: turn.id, duration: 0 });
  }

  private confirmTool(turnId: string, call: JsonObject, approved: boolean): void {
    if (!this.chat) return;
    const option = (call.options ?? []).find((o: JsonObject) => o.kind === (approved ? "approve" : "deny"));
    // Who decided, from which device: kept with the tool call (the reducers carry `_meta` into its state), so
    // every device shows it, now and after a reload.
    const action: JsonObject = {
      type: "chat/toolCallConfirmed",
      turnId,
      toolCallId: call.toolCallId,
      approved,
      _meta: { [DECIDED_BY]: { clientId: clientId(), displayName: `${deviceName()} · ${this.me.sub ?? ""}`, approved } },
    };
    if (approved) action.confirmed = "user-action";
    else action.reason = "denied";
    if (option) action.selectedOptionId = option.id;
    this.dispatch(this.chat, action);
  }

  private answerInput(request: JsonObject, form: HTMLFormElement, accept: boolean): void {
    if (!this.chat) return;
    if (!accept) {
      this.dispatch(this.chat, { type: "chat/inputCompleted", requestId: request.id, response: "decline" });
      return;
    }
    const answers: JsonObject = {};
    for (const question of request.questions ?? []) {
      const field = form.elements.namedItem(question.id) as HTMLInputElement | HTMLSelectElement | null;
      if (!field) continue;
      let value: JsonObject;
      if (question.kind === "boolean") value = { kind: "boolean", value: (field as HTMLInputElement).checked };
      else if (question.kind === "number" || question.kind === "integer") value = { kind: "number", value: Number(field.value) };
      else if (question.kind === "single-select") value = { kind: "selected", value: field.value };
      else if (question.kind === "multi-select")
        value = { kind: "selected-many", value: [...(field as HTMLSelectElement).selectedOptions].map((o) => o.value) };
      else value = { kind: "text", value: field.value };
      answers[question.id] = { state: "submitted", value };
    }
    this.dispatch(this.chat, { type: "chat/inputCompleted", requestId: request.id, response: "accept", answers });
  }

  private removeQueued(id: string): void {
    if (this.chat) this.dispatch(this.chat, { type: "chat/pendingMessageRemoved", kind: "queued", id });
  }

  // ── rendering ───────────────────────────────────────────────────────────────────────────────────────

  private render(): void {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      this.renderSessions();
      this.renderSession();
      if (this.focusOnRender && !$("session-view").hidden) {
        this.focusOnRender = false;
        this.focusSession();
      }
    });
  }

  /**
   * A session just opened: the keyboard lands in its message box (a member at a keyboard), else on its title
   * (a viewer; a phone, where a focused box would cover the conversation with the on-screen keyboard).
   */
  private focusSession(): void {
    if (this.me.role !== "viewer" && !this.touch) {
      $("prompt").focus();
      return;
    }
    const title = $("session-title");
    title.tabIndex = -1;
    title.focus();
  }

  /** Say `text` to a screen reader (the one live region; the transcript itself is not one). */
  private announce(text: string): void {
    const announcer = $("announcer");
    // The same words twice in a row are still said twice: clear first.
    announcer.textContent = "";
    window.setTimeout(() => (announcer.textContent = text), 50);
  }

  /** The open chat's turns when it was last drawn (a new last one has ended). */
  private lastTurn?: { chat: string; ids: Set<string> };

  /** What a screen reader hears of the open chat: the agent needing input, and a turn's end, once each. */
  private announceTurn(chat: JsonObject | undefined): void {
    if (!this.chat || !chat) return;
    const active = chat.activeTurn;
    const watched = this.watched?.chat === this.chat ? this.watched : undefined;
    const turns: JsonObject[] = chat.turns ?? [];
    const ending = (turn: JsonObject) => {
      const how = turn.state === "complete" ? "finished" : turn.state === "cancelled" ? "stopped (cancelled)" : "stopped with an error";
      this.announce(`The agent ${how}.`);
    };
    let told: string | undefined;
    if (watched && watched.turn !== active?.id) {
      const ended = turns.find((t: JsonObject) => t.id === watched.turn);
      if (ended) {
        ending(ended);
        told = ended.id;
      }
      this.watched = undefined;
    }
    // A turn that began and ended between two renders (an immediate error, a short answer) was never seen
    // running: its end is said all the same — once, and not for the turns a chat holds when it opens, older
    // turns fetched, or a truncation (a turn new since the last drawing, at the end: a chat that keeps a
    // bounded number of turns drops its oldest as it grows).
    const last = turns.at(-1);
    const seen = this.lastTurn?.chat === this.chat ? this.lastTurn.ids : undefined;
    if (seen && last && !seen.has(last.id) && last.id !== told && last.id !== active?.id) ending(last);
    this.lastTurn = { chat: this.chat, ids: new Set(turns.map((t) => String(t.id))) };
    if (active) {
      if (!this.watched) this.watched = { chat: this.chat, turn: active.id, askedInput: false };
      const asks = (chat.status & STATUS_INPUT_NEEDED) === STATUS_INPUT_NEEDED;
      if (asks && !this.watched.askedInput) {
        this.watched.askedInput = true;
        this.announce("The agent needs your input.");
      } else if (!asks) this.watched.askedInput = false;
    }
  }

  /** While offline, the cards' buttons are disabled, and the page says why. */
  private markPending(): void {
    const panel = $("pending");
    $("pending-offline").hidden = this.online || panel.childElementCount === 0;
    for (const control of panel.querySelectorAll("button, input, select, textarea")) {
      control.toggleAttribute("disabled", !this.online);
    }
  }

  /**
   * Whether what `part` of the page shows is still what `key` describes (then it is left alone: rebuilding it
   * on every streamed piece would swallow a click landing meanwhile and drop the keyboard's focus); records `key`.
   */
  private unchanged(part: string, key: unknown): boolean {
    const json = JSON.stringify(key);
    if (this.drawn.get(part) === json) return true;
    this.drawn.set(part, json);
    return false;
  }

  private renderSessions(): void {
    const list = $("sessions");
    const now = new Date();
    const shown = this.search ? this.search.list(this.model.sessions) : this.model.sessionList();
    const key = [
      now.toDateString(),
      this.session,
      shown.map((s) => [s.resource, s.title, s.provider, s.status, s.modifiedAt]),
    ];
    if (!this.unchanged("sessions", key)) this.drawSessions(list, shown, now);
    const count = list.querySelectorAll("li[data-uri]").length;
    $("more-sessions").hidden = !(this.search ? this.search.cursor : this.model.nextCursor);
    $("empty-sessions").hidden = count > 0;
    $("empty-sessions").textContent = this.search ? "No session has that in its title or its turns." : "No sessions yet.";
    this.renderTitle();
  }

  private drawSessions(list: HTMLElement, shown: JsonObject[], now: Date): void {
    let group = "";
    list.replaceChildren(
      ...shown.flatMap((summary) => {
        const status = statusLabel(summary.status ?? 0);
        // A link: reachable with the keyboard (Tab, Enter); its address is the session's route.
        const open = h(
          "a",
          { class: "open", href: routeHref(summary.resource), ...(summary.resource === this.session ? { "aria-current": "page" } : {}) },
          h("span", { class: "title" }, summary.title || "New session"),
          h(
            "span",
            { class: "meta" },
            `${summary.provider} · `,
            h("span", { class: "status" }, status),
            h("time", { class: "when", datetime: String(summary.modifiedAt ?? "") }, ` · ${shortWhen(summary.modifiedAt, now)}`),
          ),
        );
        open.addEventListener("click", (event) => {
          if (event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
          event.preventDefault();
          void this.openSession(summary.resource);
        });
        const entry = h(
          "li",
          {
            class: summary.resource === this.session ? "session current" : "session",
            "data-uri": summary.resource,
            "data-status": status,
          },
          open,
        );
        // Grouped by when they last changed, newest first: Today, Yesterday, the previous 7 and 30 days, older.
        const its = dayGroup(summary.modifiedAt, now);
        if (its === group) return [entry];
        group = its;
        return [h("li", { class: "session-group", "data-group": its }, its), entry];
      }),
    );
  }

  /** Whether sessions of `provider` hold a workspace (files, terminals, `!commands`), as far as the relay said. */
  private hasWorkspace(provider: string): boolean {
    return !this.workspaceAgents || this.workspaceAgents.has(provider) || !this.agentsAtInitialize.has(provider);
  }

  /** A `!command` typed in a session whose agent has no workspace goes to the agent as written: said under the box. */
  private commandHint(): void {
    const session = this.session ? this.model.state(this.session) : undefined;
    const typed = $<HTMLTextAreaElement>("prompt").value.trimStart();
    const noWorkspace = !!session && !this.hasWorkspace(String(session.provider));
    $("command-hint").hidden = !(this.terminalsOn && noWorkspace && typed.startsWith("!"));
  }

  /** Keep the transcript at its end while the user is there; otherwise say there is more below. */
  private follow(): void {
    const transcript = $("transcript");
    if (this.stuck) {
      transcript.scrollTop = transcript.scrollHeight;
    } else if (transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight >= 24) {
      $("jump-latest").hidden = false;
    }
  }

  /** The tab's title: how many sessions need input, then the open session and its status. */
  private renderTitle(): void {
    const sessions = this.model.sessionList();
    const waiting = sessions.filter((s) => statusLabel(s.status ?? 0) === "needs input").length;
    const open = sessions.find((s) => s.resource === this.session);
    const status = open ? statusLabel(open.status ?? 0) : "";
    const parts = [
      waiting > 0 ? `(${waiting} need${waiting === 1 ? "s" : ""} input)` : "",
      open ? `${open.title || "New session"}${status && status !== "idle" ? ` — ${status}` : ""}` : "",
      "ahp-relay",
    ].filter(Boolean);
    document.title = parts.join(" · ");
  }

  private renderSession(): void {
    const session = this.session ? this.model.state(this.session) : undefined;
    $("session-view").hidden = !session;
    $("no-session").hidden = !!session;
    if (!session) return;
    $("session-title").textContent = session.title || "New session";
    // An agent that could not start: said, with why, in place of a message box that would only fail.
    const failed = session.lifecycle === "failed";
    $("session-failed").hidden = !failed;
    $("session-failed").textContent = failed ? `The agent could not start: ${session.creationError?.message ?? "no reason given"}` : "";
    $("composer").hidden = failed;
    $("session-facts").textContent = this.sessionFacts(session);
    // Files where the relay serves them (a workspace), for sessions that have a folder.
    // Files and terminals only where the session's agent holds a workspace (the demo has none); an agent the
    // relay did not know of when it said which do is given the benefit of the doubt.
    const workspace = this.hasWorkspace(String(session.provider));
    $("files-toggle").hidden = !(workspace && this.directory.root && this.sessionRoot());
    // Changes where the session lists changesets; terminals where the relay lets devices open them.
    $("changes-toggle").hidden = !(session.changesets ?? []).length;
    $("terminal-toggle").hidden = !(workspace && this.terminalsOn && this.directory.root);
    this.commandHint();
    const clients: JsonObject[] = session.activeClients ?? [];
    if (!this.unchanged("people", clients.map((c) => [c.clientId, c.displayName]))) {
      $("people").replaceChildren(
        ...clients.map((c) => h("span", { class: c.clientId === clientId() ? "person me" : "person" }, c.displayName || c.clientId)),
      );
    }
    const chats: JsonObject[] = session.chats ?? [];
    const tabsKey = [this.chat, session.defaultChat, chats.map((c) => [c.resource, c.title, c.origin?.kind])];
    if (!this.unchanged("tabs", tabsKey)) this.drawTabs(session, chats);
    this.renderChat();
  }

  /** The session's chats as tabs (each but the default closable). */
  private drawTabs(session: JsonObject, chats: JsonObject[]): void {
    const tabs = chats.map((summary: JsonObject, index: number) => {
      const label = chatLabel(summary, index, session.defaultChat);
      const tab = h(
        "button",
        {
          type: "button",
          class: "tab",
          "data-chat": summary.resource,
          ...(summary.resource === this.chat ? { "aria-current": "page" } : {}),
        },
        label,
      );
      tab.addEventListener("click", () => void this.openChat(summary.resource));
      const group = h("span", { class: summary.resource === this.chat ? "tab-group current" : "tab-group" }, tab);
      // Any chat but the session's default one can be closed (for every device).
      if (summary.resource !== session.defaultChat) {
        const close = h("button", { type: "button", class: "tab-close", "aria-label": `Close ${label}`, title: `Close ${label}` }, "×");
        close.addEventListener("click", () => void this.closeChat(summary.resource, label));
        group.append(close);
      }
      return group;
    });
    $("chats").replaceChildren(...tabs);
  }

  /** What the session runs on: its agent, the model this device picks for it, its working directory. */
  private sessionFacts(session: JsonObject): string {
    const root = this.model.state(ROOT);
    const agent = (root?.agents ?? []).find((a: JsonObject) => a.provider === session.provider);
    const chosen = this.session ? this.modelChoice.get(this.session) : undefined;
    const model = chosen
      ? (agent?.models ?? []).find((m: JsonObject) => m.id === chosen)?.name || chosen
      : "default model";
    const directory = session.workingDirectories?.[0];
    const where = directory ? pathOf(String(directory)) : "";
    return [agent?.displayName || session.provider, model, where].filter(Boolean).join(" · ");
  }

  private renderChat(): void {
    const chat = this.chatState();
    // This user's draft, typed on another device, comes to this box unless the user is typing here (focus in a
    // box holding what was typed here; a box that merely has focus, as after opening a session, takes it).
    const box = $<HTMLTextAreaElement>("prompt");
    if (this.chat && chat) {
      const typing = document.activeElement === box && !this.drafts.untouched(this.chat, box.value);
      const arrived = this.drafts.arrived(this.chat, chat.draft, typing);
      if (arrived !== undefined) box.value = arrived;
    }
    const transcript = $("transcript");
    const atBottom = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 40;
    const turns: JsonObject[] = [...(chat?.turns ?? [])];
    if (chat?.activeTurn) turns.push({ ...chat.activeTurn, state: "active" });
    const idle = !chat?.activeTurn;
    const olderUnloaded = !!chat?.turnsNextCursor;
    const forks = this.chatAbilities().fork;
    const nodes = turns.map((turn, index) => {
      // What a turn offers depends on its place: edit needs the turn before it known (or none older at all),
      // retry is for the last one; neither while a turn runs.
      // Only the prompt's author edits it; anyone may retry or fork (both branch, nothing is lost).
      const author = turn.message?._meta?.[AUTHOR]?.sub as string | undefined;
      const mine = author === undefined || author === this.me.sub;
      const offers = {
        edit: idle && mine && turn.state !== "active" && (index > 0 || !olderUnloaded),
        retry: idle && index === turns.length - 1 && (index > 0 || !olderUnloaded),
        fork: turn.state === "complete" && forks,
        before: index > 0 ? (turns[index - 1].id as string) : undefined,
        author: author === undefined ? undefined : mine ? `${author} (you)` : author,
      };
      const json = JSON.stringify([turn, offers]);
      const cached = this.turnCache.get(turn.id);
      if (cached && cached.json === json) return cached.node;
      const node = renderTurn(turn, offers, {
        edit: (node, prompt, text, before) => this.startEdit(node, prompt, text, before),
        retry: (before, message) => void this.branch(before, message),
        fork: (turnId) => void this.fork(turnId),
      });
      this.turnCache.set(turn.id, { json, node });
      return node;
    });
    if (nodes.length !== transcript.childElementCount || nodes.some((n, i) => transcript.children[i] !== n)) {
      transcript.replaceChildren(...nodes);
    }
    if (this.find.query) this.showFind();
    if (atBottom) transcript.scrollTop = transcript.scrollHeight;

    const active = chat?.activeTurn;
    const state = $("turn-state");
    state.textContent = !chat
      ? ""
      : active
        ? (chat.status & STATUS_INPUT_NEEDED) === STATUS_INPUT_NEEDED
          ? "waiting for you"
          : "agent is working…"
        : "idle";
    state.dataset.state = active ? "active" : "idle";
    $("cancel").hidden = !active;
    this.renderPending(active);
    this.announceTurn(chat);
    const queued: JsonObject[] = chat?.queuedMessages ?? [];
    $("queued").replaceChildren(
      ...queued.map((m) => {
        const remove = h("button", { type: "button", class: "link" }, "remove");
        remove.addEventListener("click", () => this.removeQueued(m.id));
        return h("li", { class: "queued" }, h("span", {}, m.message?.text ?? ""), remove);
      }),
    );
  }

  /** Confirmations and input requests of the running turn, kept as they are while they stay open. */
  private renderPending(turn: JsonObject | undefined): void {
    const panel = $("pending");
    const open = new Map<string, () => HTMLElement>();
    for (const part of turn?.responseParts ?? []) {
      const call = part.toolCall;
      if (part.kind === "toolCall" && call?.status === "pending-confirmation") {
        open.set(`tool:${call.toolCallId}`, () => confirmationCard(call, (approved) => this.confirmTool(turn!.id, call, approved)));
      }
      if (part.kind === "inputRequest" && !part.response) {
        open.set(`input:${part.request.id}`, () => inputForm(part.request, (form, accept) => this.answerInput(part.request, form, accept)));
      }
    }
    for (const child of [...panel.children] as HTMLElement[]) {
      if (!open.has(child.dataset.key ?? "")) child.remove();
    }
    for (const [key, build] of open) {
      if (!panel.querySelector(`[data-key="${CSS.escape(key)}"]`)) {
        const card = build();
        card.dataset.key = key;
        panel.append(card);
      }
    }
    this.markPending();
  }

}

async function main(): Promise<void> {
  wireSignInForm();
  const taken = await takeToken();
  const token = taken.ask ? await askToSwitch(taken.ask) : taken.token;
  if (!token) {
    await showSignIn();
    return;
  }
  await loadReducers();
  document.body.dataset.view = "sessions";
  new App(token).start();
}

void main();
