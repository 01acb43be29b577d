// Signing in and recovering: where the token comes from (a link's or an identity provider's fragment, a pasted
// token, this tab's storage), why a connection was refused (asked of the relay, since a page cannot read the
// HTTP status of a refused WebSocket upgrade), the sign-in panel that says so and offers a way back, and
// signing out. The token never goes into a URL: the WebSocket carries it in `Sec-WebSocket-Protocol`.

import type { Refusal } from "./rpc";

const TOKEN_KEY = "ahp-relay.token";
/** The `state` the identity provider must hand back with the token, while a login is under way. */
const STATE_KEY = "ahp-relay.sign-in-state";
/** The place (session, chat) the page showed when it left for the identity provider. */
const ROUTE_KEY = "ahp-relay.sign-in-route";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

/** The subprotocols a WebSocket offers: the one the relay selects, and the token. */
export function socketProtocols(token: string): string[] {
  return ["ahp.v1", `ahp-relay.bearer.${token}`];
}

/** The relay's tokens are JWTs: three base64url parts (a pasted `Bearer …` loses its prefix). */
function asToken(raw: string): string | undefined {
  const token = raw.trim().replace(/^bearer\s+/i, "");
  return /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/.test(token) ? token : undefined;
}

const NOT_A_TOKEN = "That is not an access token (it should be three parts separated by dots).";

/** Why the token in the address could not be taken, if it could not (shown on the sign-in panel, or as a note). */
export let takeProblem: string | undefined;

/** The last identity this browser signed in as (no token: who, to compare a link's token with). */
const IDENTITY_KEY = "ahp-relay.identity";

/** Who a token says it is: for display and comparison only (the relay checks the token). */
export interface Identity {
  sub: string;
  tid: string;
  role: string;
}

/** The identity a JWT's payload names, if it is readable. */
export function identityOf(token: string | undefined): Identity | undefined {
  if (!token) return undefined;
  try {
    const payload = JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/")));
    return { sub: String(payload.sub ?? "?"), tid: String(payload.tid ?? "?"), role: String(payload.role ?? "?") };
  } catch {
    return undefined;
  }
}

/** The identity in words, e.g. `alice (member) of tenant acme`. */
export function describe(identity: Identity): string {
  return `${identity.sub} (${identity.role}) of tenant ${identity.tid}`;
}

/** Remember who signed in here, so a link for someone else is asked about even after signing out. */
export function rememberIdentity(identity: Identity): void {
  localStorage.setItem(IDENTITY_KEY, JSON.stringify({ sub: identity.sub, tid: identity.tid, role: identity.role }));
}

/** Signing out on purpose: this browser forgets who signed in (a shared computer keeps nobody's name). */
export function forgetIdentity(): void {
  localStorage.removeItem(IDENTITY_KEY);
}

function lastIdentity(): Identity | undefined {
  try {
    const known = JSON.parse(localStorage.getItem(IDENTITY_KEY) ?? "null");
    return known && typeof known.sub === "string" && typeof known.tid === "string" ? known : undefined;
  } catch {
    return undefined;
  }
}

/** A link's token for someone other than who this tab (or browser) is signed in as: the user decides. */
export interface SwitchQuestion {
  /** The link's token. */
  token: string;
  /** This tab's own token, if it has one (kept when the user declines). */
  current?: string;
  link: Identity;
  known: Identity;
  /** The place the link names (`s`, `c`, `host`): followed only when the user switches. */
  place: [string, string][];
}

/** What the address and this tab's storage yield: a token to use, or a question to ask first. */
export interface Taken {
  token?: string;
  ask?: SwitchQuestion;
}

const LINK_KEYS = ["token", "access_token", "token_type", "expires_in", "scope", "state", "id_token"];
const PLACE_KEYS = ["s", "c", "host"];

function replaceFragment(hash: URLSearchParams): void {
  const rest = hash.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
}

/**
 * The token to use. The address may bring one, and is cleared of it at once:
 * - an identity provider's answer (`#access_token=…&state=…`) is taken only when it carries the `state` of a
 *   sign-in this tab started (and still waits for); an unsolicited or mismatched answer is refused and leaves a
 *   started sign-in waiting;
 * - a link's `#token=…` is refused when the relay signs in through an identity provider (`--sign-in-url`);
 *   otherwise, when it is for another user or tenant than this tab's (or this browser's last) sign-in, the
 *   user is asked first, and the place the link names is followed only if they switch.
 * Otherwise this tab's own token.
 */
export async function takeToken(): Promise<Taken> {
  const hash = new URLSearchParams(location.hash.slice(1));
  const answer = hash.get("access_token");
  const linked = hash.get("token");
  const current = sessionStorage.getItem(TOKEN_KEY) ?? undefined;
  if (answer === null && linked === null) return { token: current };
  const state = hash.get("state");
  for (const key of LINK_KEYS) hash.delete(key);
  if (answer !== null) {
    const expected = sessionStorage.getItem(STATE_KEY);
    if (!expected || state !== expected) {
      // Not the answer to this tab's sign-in: refused, and a sign-in under way keeps waiting for its own.
      takeProblem = expected
        ? "The sign-in answer did not match the sign-in this page started; sign in again."
        : "A sign-in answer arrived that this page did not ask for; it was not used.";
      // Nor is the place it names opened with this tab's own sign-in.
      if (current) for (const key of PLACE_KEYS) hash.delete(key);
      replaceFragment(hash);
      return { token: current };
    }
    // Back where the page was before it left for the provider.
    const route = sessionStorage.getItem(ROUTE_KEY);
    if (route && !hash.has("s")) {
      for (const [key, value] of new URLSearchParams(route)) hash.set(key, value);
    }
    sessionStorage.removeItem(STATE_KEY);
    sessionStorage.removeItem(ROUTE_KEY);
    replaceFragment(hash);
    const token = asToken(answer);
    if (!token) {
      takeProblem = NOT_A_TOKEN;
      return { token: current };
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    return { token };
  }
  // A link with a token: its place is the sender's until the user takes the link.
  const place: [string, string][] = PLACE_KEYS.flatMap((key) => (hash.has(key) ? [[key, hash.get(key) ?? ""] as [string, string]] : []));
  const token = asToken(linked ?? "");
  const refuse = (problem: string): Taken => {
    takeProblem = problem;
    if (current) for (const key of PLACE_KEYS) hash.delete(key);
    replaceFragment(hash);
    return { token: current };
  };
  // A sign-in under way waits for its own answer; a relay that signs in through an identity provider — or whose
  // configuration cannot be read to say it does not — takes no token from a link.
  if (sessionStorage.getItem(STATE_KEY)) return refuse("A sign-in is under way: a link with a token cannot sign you in meanwhile.");
  const config = await webConfig();
  if (!config.known) return refuse("The relay's sign-in settings could not be read, so the link's token was not used; reload to try again.");
  if (config.signInUrl) return refuse("This relay signs in through your identity provider: a link with a token cannot sign you in.");
  if (!token) return refuse(NOT_A_TOKEN);
  const link = identityOf(token) ?? { sub: "an account this page cannot read", tid: "?", role: "?" };
  const known = identityOf(current) ?? lastIdentity();
  for (const key of PLACE_KEYS) hash.delete(key);
  replaceFragment(hash);
  // Someone else (or someone this page cannot name) while this tab or browser knows who signed in: ask.
  if (known && (link.sub !== known.sub || link.tid !== known.tid || !identityOf(token))) {
    return { ask: { token, current, link, known, place } };
  }
  return { token: adopt(token, place) };
}

/** Take a link's `token` for this tab and follow the `place` it names. */
export function adopt(token: string, place: [string, string][]): string {
  sessionStorage.setItem(TOKEN_KEY, token);
  const hash = new URLSearchParams(location.hash.slice(1));
  for (const [key, value] of place) hash.set(key, value);
  replaceFragment(hash);
  return token;
}

/**
 * Asks whether to switch to a link's token for another user or tenant (`#confirm-switch`). Staying is the
 * default (Escape, or the first button); the link's place is followed only when switching.
 */
export function askToSwitch(question: SwitchQuestion): Promise<string | undefined> {
  const dialog = $<HTMLDialogElement>("confirm-switch");
  $("confirm-switch-link").textContent = describe(question.link);
  $("confirm-switch-known").textContent = describe(question.known);
  $("confirm-switch-stay").textContent = question.current ? `Stay ${question.known.sub}` : "Do not sign in";
  $("confirm-switch-ok").textContent = `Switch to ${question.link.sub}`;
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        if (dialog.returnValue === "switch") resolve(adopt(question.token, question.place));
        else {
          takeProblem = question.current ? undefined : "You did not sign in with the link.";
          resolve(question.current);
        }
      },
      { once: true },
    );
    dialog.returnValue = "stay";
    dialog.showModal();
  });
}

/** Forget this tab's token (a reload then asks to sign in instead of retrying it). */
export function forgetToken(): void {
  sessionStorage.removeItem(TOKEN_KEY);
}

/**
 * Why the relay refuses `token` for `host`, or `undefined` when it accepts it (then a failed connection was
 * the network's doing, and retrying can help). A token that is no good is to be forgotten; one that is good
 * but not for this host (403) or a host that cannot exist (404) is kept: the address is what is wrong.
 */
export async function refusal(token: string, host: string | null): Promise<Refusal | undefined> {
  let response: Response;
  try {
    const query = host ? `?host=${encodeURIComponent(host)}` : "";
    response = await fetch(`/v1/auth/check${query}`, { headers: { Authorization: `Bearer ${token}` }, cache: "no-store" });
  } catch {
    return undefined;
  }
  if (response.ok || ![401, 403, 404].includes(response.status)) return undefined;
  const body = await response.json().catch(() => ({}));
  const detail = `HTTP ${response.status}: ${String(body.error ?? "refused")}`;
  return { reason: plainReason(detail), detail, forget: response.status === 401 };
}

/** The relay's reason, said for a person (its own words stay in the panel's details). */
function plainReason(reason: string): string {
  if (/ExpiredSignature|expired/i.test(reason)) return "Your sign-in has expired.";
  if (/does not grant this host/.test(reason)) return "Your account may not open this host.";
  if (/HTTP 404/.test(reason)) return "This address names a host that cannot exist.";
  if (/no access token/.test(reason)) return "You are not signed in.";
  return "The relay did not accept your sign-in.";
}

/** Where to send a user to sign in, if the relay has an identity provider's login configured. */
async function signInUrl(): Promise<string | undefined> {
  return (await webConfig()).signInUrl;
}

/** The relay's configuration for the page; `known: false` when it could not be read. */
async function webConfig(): Promise<{ known: boolean; signInUrl?: string }> {
  try {
    const response = await fetch("/v1/web-config", { cache: "no-store" });
    if (!response.ok) return { known: false };
    const config = await response.json();
    return { known: true, signInUrl: typeof config.signInUrl === "string" && config.signInUrl ? config.signInUrl : undefined };
  } catch {
    return { known: false };
  }
}

/**
 * Shows the sign-in panel: why (`reason`, with the relay's own words in `detail`), a field to paste a token and
 * the identity provider's login when configured. The route in the address bar is kept, so signing in again
 * returns to the same chat.
 */
export async function showSignIn(reason?: string, detail?: string): Promise<void> {
  document.body.dataset.view = "signin";
  // Nobody is signed in here any more: the header, the pill and the tab's title say so (no session's news).
  $("who").textContent = "";
  $("who").title = "";
  const pill = $("link-state");
  // A refused connection already said why (refused, expired); otherwise nobody is signed in.
  if (pill.dataset.state !== "refused") {
    pill.dataset.state = "signedout";
    pill.textContent = /expired/i.test(reason ?? takeProblem ?? "") ? "Sign-in expired" : "Not signed in";
  }
  document.title = "Sign in · ahp-relay";
  $("expiry-warning").hidden = true;
  reason ??= takeProblem;
  const why = $("signin-reason");
  why.textContent = reason ?? "";
  why.title = detail ?? "";
  why.hidden = !reason;
  const template = await signInUrl();
  const provider = $<HTMLAnchorElement>("signin-provider");
  provider.hidden = !template;
  if (template) {
    provider.href = template.replace("{return}", encodeURIComponent(location.href.split("#")[0])).replace("{state}", "");
    // Leaving for the provider: a fresh `state` it must hand back (so a link with someone else's token cannot
    // sign this tab in), and the place to come back to.
    provider.onclick = (event) => {
      event.preventDefault();
      const state = crypto.randomUUID();
      sessionStorage.setItem(STATE_KEY, state);
      const route = new URLSearchParams(location.hash.slice(1));
      route.delete("token");
      sessionStorage.setItem(ROUTE_KEY, route.toString());
      location.assign(
        template.replace("{return}", encodeURIComponent(location.href.split("#")[0])).replace("{state}", encodeURIComponent(state)),
      );
    };
  }
  $("signin-token").focus();
}

/** Wires the sign-in form: a pasted token is kept for this tab and the page starts over with it. */
export function wireSignInForm(): void {
  $("signin").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = asToken($<HTMLInputElement>("signin-token").value);
    if (!token) {
      const why = $("signin-reason");
      why.textContent = NOT_A_TOKEN;
      why.title = "";
      why.hidden = false;
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    location.reload();
  });
}
