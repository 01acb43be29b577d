// Per-chat drafts: what a user types in a chat's message box stays with that chat. It is kept in this browser at
// once (per user, tenant and chat: it survives a reload, a switch to another session and an expired sign-in;
// signing out forgets it). Where the user wants it (`shareDrafts`, off unless they turn it on: a chat's AHP
// `draft` is one slot every subscriber of the chat sees), it is also synced, debounced, into the chat's
// `draft` (`chat/draftChanged`), which the relay marks with its author, so the user's other devices pick it up.
// A draft another member left in a shared chat is theirs: it is not put in this user's box, and their sending
// it does not clear this user's.

import type { JsonObject } from "./rpc";

/** Where a draft's author is kept in its `_meta`. */
export const DRAFT_AUTHOR = "ahpRelay/author";
/** How long typing pauses before the draft is synced to the relay. */
const SYNC_AFTER_MS = 600;

/** Who is typing: a draft belongs to this user of this tenant. */
export interface Author {
  sub: string;
  tid: string;
}


/** Where this browser keeps whether the user shares drafts with their other devices. */
const SHARE_KEY = "ahp-relay.share-drafts";

export class Drafts {
  private timers = new Map<string, number>();
  /** The last draft text of ours each chat's state carried (what was synced or seen from another device). */
  private seen = new Map<string, string>();
  /**
   * The text each chat's draft was last synced to and not yet seen back: until the chat's state carries it, the
   * state is older than the box, and what it holds is not put there.
   */
  private sending = new Map<string, string>();
  /** Whether the draft each chat's state carried last was this user's (so its clearing is theirs to follow). */
  private lastWasMine = new Map<string, boolean>();

  constructor(
    private author: Author,
    /** Dispatches `chat/draftChanged` on `chat` (the draft cleared when undefined); whether it was sent. */
    private sync: (chat: string, draft: JsonObject | undefined) => boolean,
  ) {}

  private key(chat: string): string {
    return `ahp-relay.draft.${this.author.tid}.${this.author.sub}.${chat}`;
  }

  /** Whether drafts go to the chat's shared `draft` (the user's other devices; the chat's members see it). */
  get sharing(): boolean {
    return localStorage.getItem(SHARE_KEY) === "1";
  }

  set sharing(on: boolean) {
    if (on) localStorage.setItem(SHARE_KEY, "1");
    else localStorage.removeItem(SHARE_KEY);
  }

  /** Signing out: this user's drafts (and the sharing choice) leave this browser. */
  forgetAll(): void {
    const prefix = `ahp-relay.draft.${this.author.tid}.${this.author.sub}.`;
    for (const key of Object.keys(localStorage)) if (key.startsWith(prefix)) localStorage.removeItem(key);
    localStorage.removeItem(SHARE_KEY);
  }

  /** Whether `draft` (a chat state's `draft`) is this user's. */
  mine(draft: JsonObject | undefined): boolean {
    const by = draft?._meta?.[DRAFT_AUTHOR];
    // The relay stamps the author (`{sub}`) itself; drafts live in the tenant's own chats.
    return !!by && by.sub === this.author.sub;
  }

  /** The text to put in the box on opening `chat`: this browser's draft, else this user's synced one. */
  initial(chat: string, state: JsonObject | undefined): string {
    const local = localStorage.getItem(this.key(chat));
    const synced = this.mine(state?.draft) ? String(state?.draft?.text ?? "") : undefined;
    this.lastWasMine.set(chat, synced !== undefined);
    this.sending.delete(chat);
    if (synced !== undefined) this.seen.set(chat, synced);
    return local ?? (this.sharing ? synced : undefined) ?? "";
  }

  /** The user typed `text` in `chat`'s box: kept here now, synced once typing pauses. */
  typed(chat: string, text: string): void {
    if (text) localStorage.setItem(this.key(chat), text);
    else localStorage.removeItem(this.key(chat));
    window.clearTimeout(this.timers.get(chat));
    if (!this.sharing) return;
    this.timers.set(
      chat,
      window.setTimeout(() => this.flush(chat), SYNC_AFTER_MS),
    );
  }

  /** Sync `chat`'s pending draft now (leaving the chat, or the page). */
  flush(chat: string): void {
    if (!this.timers.has(chat)) return;
    window.clearTimeout(this.timers.get(chat));
    this.timers.delete(chat);
    const text = localStorage.getItem(this.key(chat)) ?? "";
    if ((this.seen.get(chat) ?? "") === text) return;
    // Offline, it stays here and goes with the next pause in typing.
    if (this.sync(chat, text ? { text, origin: { kind: "user" }, _meta: { [DRAFT_AUTHOR]: { sub: this.author.sub } } } : undefined)) {
      this.seen.set(chat, text);
      this.sending.set(chat, text);
    }
  }

  /** Flush every chat's pending draft. */
  flushAll(): void {
    for (const chat of [...this.timers.keys()]) this.flush(chat);
  }

  /** The message in `chat` was sent: its draft is gone, here and (when it was ours) in the chat. */
  sent(chat: string, state: JsonObject | undefined): void {
    window.clearTimeout(this.timers.get(chat));
    this.timers.delete(chat);
    localStorage.removeItem(this.key(chat));
    this.seen.set(chat, "");
    if (this.mine(state?.draft) && this.sync(chat, undefined)) this.sending.set(chat, "");
  }

  /** Whether `text` in `chat`'s box is only what arrived or was synced (nothing typed here since). */
  untouched(chat: string, text: string): boolean {
    return text === "" || text === (this.seen.get(chat) ?? "");
  }

  /**
   * `chat`'s state now carries `draft` (called on every render, so whose the slot holds is always known): when
   * it is a new draft of ours from another device, the text the box should show (and this browser keeps);
   * otherwise undefined — always while the user is `typing` here (the box has focus), which wins.
   */
  arrived(chat: string, draft: JsonObject | undefined, typing: boolean): string | undefined {
    const wasMine = this.lastWasMine.get(chat) ?? false;
    this.lastWasMine.set(chat, this.mine(draft));
    if (typing || this.timers.has(chat) || !this.sharing) return undefined;
    // Ours, or ours cleared (sent from another device of ours); another member's draft, or their clearing of
    // it, is left alone.
    const text = this.mine(draft) ? String(draft?.text ?? "") : !draft && wasMine ? "" : undefined;
    if (text === undefined) return undefined;
    // What this browser synced last, not yet seen back: the state is older than the box.
    const sent = this.sending.get(chat);
    if (sent !== undefined) {
      if (sent !== text) return undefined;
      this.sending.delete(chat);
    }
    if (this.seen.get(chat) === text) return undefined;
    this.seen.set(chat, text);
    if (text) localStorage.setItem(this.key(chat), text);
    else localStorage.removeItem(this.key(chat));
    return text;
  }
}
