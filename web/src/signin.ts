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

/** Why the token in the address could not be taken, if it could not (shown on the sign-in panel). */
export let takeProblem: string | undefined;

/**
 * The token from `#token=…` or an identity provider's `#access_token=…` (then removed from the address bar),
 * else this tab's. A provider's answer must carry the `state` this page sent it, when it sent one.
 */
export function takeToken(): string | undefined {
  const hash = new URLSearchParams(location.hash.slice(1));
  const fromLink = hash.get("token") ?? hash.get("access_token");
  if (fromLink !== null) {
    const expectedState = sessionStorage.getItem(STATE_KEY);
    const fromProvider = hash.has("access_token");
    const stateOk = !fromProvider || !expectedState || hash.get("state") === expectedState;
    for (const key of ["token", "access_token", "token_type", "expires_in", "scope", "state", "id_token"]) hash.delete(key);
    // Back where the page was before it left for the provider.
    const route = sessionStorage.getItem(ROUTE_KEY);
    if (fromProvider && route && !hash.has("s")) {
      for (const [key, value] of new URLSearchParams(route)) hash.set(key, value);
    }
    sessionStorage.removeItem(STATE_KEY);
    sessionStorage.removeItem(ROUTE_KEY);
    const rest = hash.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
    const token = asToken(fromLink);
    if (!stateOk) takeProblem = "The sign-in answer did not match the sign-in this page started; sign in again.";
    else if (!token) takeProblem = NOT_A_TOKEN;
    else {
      sessionStorage.setItem(TOKEN_KEY, token);
      return token;
    }
    return undefined;
  }
  return sessionStorage.getItem(TOKEN_KEY) ?? undefined;
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
  try {
    const response = await fetch("/v1/web-config", { cache: "no-store" });
    const config = await response.json();
    return typeof config.signInUrl === "string" && config.signInUrl ? config.signInUrl : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Shows the sign-in panel: why (`reason`, with the relay's own words in `detail`), a field to paste a token and
 * the identity provider's login when configured. The route in the address bar is kept, so signing in again
 * returns to the same chat.
 */
export async function showSignIn(reason?: string, detail?: string): Promise<void> {
  document.body.dataset.view = "signin";
  // Nobody is signed in here any more.
  $("who").textContent = "";
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
