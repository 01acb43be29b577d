// The page's connection to the relay: one WebSocket speaking JSON-RPC 2.0, requests matched to replies,
// notifications handed to a listener, and a reconnecting loop with exponential back-off and jitter.

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: any };

export class RpcError extends Error {
  constructor(public code: number, message: string, public data?: unknown) {
    super(message);
  }
}

/** What the connection is doing, for the status line: `reason` in words for a person, `detail` as it came. */
export type LinkState =
  | { kind: "connecting"; attempt: number }
  | { kind: "online" }
  | { kind: "offline"; retryInMs: number; reason: string; detail: string }
  | { kind: "refused"; reason: string; detail: string; forget: boolean };

/** Why a connection was refused: in words, and the relay's own; `forget` when the token itself is no good. */
export interface Refusal {
  reason: string;
  detail: string;
  forget: boolean;
}

export interface LinkEvents {
  /** A fresh socket is open: do the handshake (initialize or reconnect) before anything else. */
  opened(link: Link): Promise<void>;
  notification(method: string, params: JsonObject): void;
  state(state: LinkState): void;
  /** After a connection failed before it opened: whether the relay refuses this page (retrying cannot help). */
  refused(): Promise<Refusal | undefined>;
}

const REQUEST_TIMEOUT_MS = 30_000;
const BACKOFF_MIN_MS = 250;
const BACKOFF_MAX_MS = 15_000;

/** Close codes after which connecting again with the same token cannot help, in words. */
const FATAL_CLOSE_CODES = new Map([
  [1008, "The relay refused this connection."],
  [4001, "Your sign-in has expired."],
  [4003, "The relay refused this connection."],
]);

/** What a close code that the page recovers from means, in words. */
function closeInWords(code: number): string {
  switch (code) {
    case 1001:
    case 1012:
      return "The relay is restarting";
    case 1011:
      return "The relay is briefly unavailable";
    case 1013:
      return "The connection fell behind";
    case 4000:
      return "Offline";
    default:
      return "Connection lost";
  }
}

export class Link {
  private socket?: WebSocket;
  private nextId = 1;
  private pending = new Map<number, { resolve(v: any): void; reject(e: Error): void; timer: number }>();
  private attempt = 0;
  private stopped = false;
  private retryTimer?: number;

  constructor(
    private url: string,
    private protocols: string[],
    private events: LinkEvents,
  ) {}

  start(): void {
    this.open();
  }

  /** Closes the socket as a network drop would (the loop reconnects). */
  drop(): void {
    this.socket?.close(4000, "dropped by the page");
  }

  /** Closes for good (signing out). */
  stop(): void {
    this.stopped = true;
    window.clearTimeout(this.retryTimer);
    const socket = this.socket;
    this.socket = undefined;
    socket?.close(1000, "signed out");
  }

  /** Reconnects at once instead of waiting out the back-off (e.g. when the browser says it is online). */
  retryNow(): void {
    if (this.socket || this.stopped) return;
    window.clearTimeout(this.retryTimer);
    this.open();
  }

  request<T = any>(method: string, params: JsonObject): Promise<T> {
    const socket = this.socket;
    if (!socket || socket.readyState !== WebSocket.OPEN) {
      return Promise.reject(new Error("not connected"));
    }
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = window.setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${method} timed out`));
      }, REQUEST_TIMEOUT_MS);
      this.pending.set(id, { resolve, reject, timer });
      socket.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  notify(method: string, params: JsonObject): boolean {
    const socket = this.socket;
    if (!socket || socket.readyState !== WebSocket.OPEN) return false;
    socket.send(JSON.stringify({ jsonrpc: "2.0", method, params }));
    return true;
  }

  get online(): boolean {
    return this.socket?.readyState === WebSocket.OPEN;
  }

  private open(): void {
    this.attempt += 1;
    this.events.state({ kind: "connecting", attempt: this.attempt });
    let socket: WebSocket;
    try {
      socket = new WebSocket(this.url, this.protocols);
    } catch (error) {
      // A token no subprotocol can carry: no connection with it can ever work.
      this.stopped = true;
      this.events.state({ kind: "refused", reason: "That access token cannot be used.", detail: String(error), forget: true });
      return;
    }
    this.socket = socket;
    let opened = false;
    socket.onopen = async () => {
      opened = true;
      try {
        await this.events.opened(this);
        this.attempt = 0;
        this.events.state({ kind: "online" });
      } catch (error) {
        socket.close(4000, "handshake failed");
        this.events.state({ kind: "offline", retryInMs: 0, reason: "Could not resume", detail: String(error) });
      }
    };
    socket.onmessage = (event) => this.receive(String(event.data));
    socket.onclose = async (event) => {
      if (this.socket !== socket) return;
      this.socket = undefined;
      for (const [, call] of this.pending) {
        window.clearTimeout(call.timer);
        call.reject(new Error("connection lost"));
      }
      this.pending.clear();
      const detail = `closed with code ${event.code}${event.reason ? `: ${event.reason}` : ""}`;
      const fatal = FATAL_CLOSE_CODES.get(event.code);
      if (fatal) {
        this.stopped = true;
        this.events.state({ kind: "refused", reason: fatal, detail, forget: true });
        return;
      }
      // Refused before it opened: the page cannot see the HTTP status, so it asks the relay why.
      if (!opened) {
        const refusal = await this.events.refused();
        // Meanwhile the page may have stopped, or reconnected on its own (the browser said it is online).
        if (this.stopped || this.socket) return;
        if (refusal) {
          this.stopped = true;
          this.events.state({ kind: "refused", ...refusal });
          return;
        }
      }
      const reason = closeInWords(event.code);
      // Exponential back-off with full jitter, so a relay restart is not met by every page at once.
      const ceiling = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** Math.min(this.attempt, 10));
      const delay = Math.round(BACKOFF_MIN_MS / 2 + Math.random() * ceiling);
      this.events.state({ kind: "offline", retryInMs: delay, reason, detail });
      this.retryTimer = window.setTimeout(() => this.open(), delay);
    };
  }

  private receive(text: string): void {
    let message: JsonObject;
    try {
      message = JSON.parse(text);
    } catch {
      return;
    }
    if (typeof message.id === "number" && this.pending.has(message.id) && !message.method) {
      const call = this.pending.get(message.id)!;
      this.pending.delete(message.id);
      window.clearTimeout(call.timer);
      if (message.error) {
        call.reject(new RpcError(message.error.code, message.error.message, message.error.data));
      } else {
        call.resolve(message.result);
      }
      return;
    }
    if (typeof message.method === "string" && message.id === undefined) {
      this.events.notification(message.method, message.params ?? {});
    } else if (typeof message.method === "string") {
      // A request from the relay (e.g. for a client-provided resource): this page offers none.
      this.socket?.send(
        JSON.stringify({
          jsonrpc: "2.0",
          id: message.id,
          error: { code: -32601, message: `the web client does not handle ${message.method}` },
        }),
      );
    }
  }
}
