// The page's model of the relay: the subscribed channels' states (kept by the official `ahp` reducers in
// WebAssembly), the serverSeq each channel has reached, and the host's session list. It applies snapshots and
// envelopes and says which channels changed; it never reduces an action itself.

import init, { Mirror } from "./reducers.js";
import type { JsonObject } from "./rpc";

export const ROOT = "ahp-root://";

export async function loadReducers(): Promise<void> {
  await init({ module_or_path: new URL("reducers_bg.wasm", import.meta.url) });
}

export class Model {
  private mirror = new Mirror();
  /** Highest serverSeq applied per channel (snapshot fromSeq or envelope). */
  private applied = new Map<string, number>();
  /** Cached parsed states, dropped when their channel changes. */
  private parsed = new Map<string, JsonObject | undefined>();
  /**
   * Envelopes of channels being subscribed, held until their snapshot arrives: the relay may send a channel's
   * next actions before the `subscribe` reply that carries its snapshot (the reply waits for the store).
   */
  private early = new Map<string, JsonObject[]>();

  /** A `subscribe` to `uri` is under way: hold its envelopes until the snapshot. */
  expect(uri: string): void {
    if (!this.applied.has(uri)) this.early.set(uri, this.early.get(uri) ?? []);
  }
  /** Highest serverSeq seen on any channel: what `reconnect` resumes from. */
  lastSeen = 0;
  sessions = new Map<string, JsonObject>();
  nextCursor: string | undefined;

  /** Seeds a channel from a snapshot; replaces what was there. */
  applySnapshot(snapshot: JsonObject): void {
    this.mirror.applySnapshot(JSON.stringify(snapshot));
    const seq = Number(snapshot.fromSeq ?? 0);
    this.applied.set(snapshot.resource, seq);
    this.lastSeen = Math.max(this.lastSeen, seq);
    this.parsed.delete(snapshot.resource);
    const early = this.early.get(snapshot.resource) ?? [];
    this.early.delete(snapshot.resource);
    for (const envelope of early) this.applyEnvelope(envelope);
  }

  /**
   * Applies an envelope unless its channel already has it (replays overlap live delivery). A rejected action
   * (`rejectionReason`) was not applied by the relay, so it is not applied here either. Returns whether the
   * channel's state moved.
   */
  applyEnvelope(envelope: JsonObject): boolean {
    const seq = Number(envelope.serverSeq ?? 0);
    this.lastSeen = Math.max(this.lastSeen, seq);
    const channel = envelope.channel as string;
    const have = this.applied.get(channel);
    if (have === undefined) {
      this.early.get(channel)?.push(envelope);
      return false;
    }
    if (seq <= have || envelope.rejectionReason) return false;
    this.applied.set(channel, seq);
    this.mirror.applyEnvelope(JSON.stringify(envelope));
    this.parsed.delete(channel);
    return true;
  }

  /** Marks a seq as seen without a state (e.g. `initialize`'s serverSeq). */
  saw(seq: number): void {
    this.lastSeen = Math.max(this.lastSeen, seq);
  }

  has(uri: string): boolean {
    return this.applied.has(uri);
  }

  forget(uri: string): void {
    this.applied.delete(uri);
    this.parsed.delete(uri);
    this.early.delete(uri);
  }

  /** Everything mirrored, for `reconnect`'s subscription list. */
  channels(): string[] {
    return [...this.applied.keys()];
  }

  state(uri: string): JsonObject | undefined {
    if (!this.applied.has(uri)) return undefined;
    if (!this.parsed.has(uri)) {
      const json = this.mirror.state(uri);
      this.parsed.set(uri, json === undefined ? undefined : JSON.parse(json));
    }
    return this.parsed.get(uri);
  }

  /** The host's session list, newest first, from `listSessions` and the root notifications. */
  sessionList(): JsonObject[] {
    return [...this.sessions.values()].sort((a, b) =>
      String(b.modifiedAt ?? "").localeCompare(String(a.modifiedAt ?? "")),
    );
  }

  onRootNotification(method: string, params: JsonObject): boolean {
    if (method === "root/sessionAdded" && params.summary) {
      this.sessions.set(params.summary.resource, params.summary);
      return true;
    }
    if (method === "root/sessionRemoved") {
      return this.sessions.delete(params.session);
    }
    if (method === "root/sessionSummaryChanged") {
      const summary = this.sessions.get(params.session);
      if (!summary) return false;
      this.sessions.set(params.session, { ...summary, ...params.changes });
      return true;
    }
    return false;
  }
}
