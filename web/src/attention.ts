// Getting the user's attention when an agent needs them: a browser notification (when permitted) the moment a
// session the user is not looking at starts waiting for input, and the control that asks for the permission
// (browsers only ask in answer to a click).

import type { JsonObject } from "./rpc";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

export class Attention {
  /** Whether each session waited for input when last seen, so only a change to waiting notifies. */
  private waiting = new Map<string, boolean>();

  constructor(
    private isWaiting: (summary: JsonObject) => boolean,
    private lookingAt: () => string | undefined,
    private open: (session: string) => void,
  ) {}

  /** Shows the "notify me" control while the browser has not been asked yet. */
  wire(): void {
    const button = $("notify-toggle");
    const supported = "Notification" in window;
    button.hidden = !supported || Notification.permission !== "default";
    button.addEventListener("click", async () => {
      await Notification.requestPermission();
      button.hidden = Notification.permission !== "default";
    });
  }

  /** Takes the session list as it is now; notifies for each session that started waiting out of sight. */
  observe(sessions: JsonObject[]): void {
    for (const summary of sessions) {
      const now = this.isWaiting(summary);
      const before = this.waiting.get(summary.resource);
      this.waiting.set(summary.resource, now);
      if (before === false && now) this.notify(summary);
    }
  }

  private notify(summary: JsonObject): void {
    if (!("Notification" in window) || Notification.permission !== "granted") return;
    if (summary.resource === this.lookingAt() && document.visibilityState === "visible") return;
    const title = summary.title || "A session";
    let notification: Notification;
    try {
      notification = new Notification(`${title} needs input`, {
        body: "The agent is waiting for you.",
        tag: summary.resource,
      });
    } catch {
      // Some browsers (Android's Chrome) show notifications only through a service worker: none, then.
      return;
    }
    notification.onclick = () => {
      window.focus();
      this.open(summary.resource);
      notification.close();
    };
  }
}
