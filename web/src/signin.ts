// Signing in and recovering: where the token comes from (a link's or an identity provider's fragment, a pasted
// token, this tab's storage), why a connection was refused (asked of the relay, since a page cannot read the
// HTTP status of a refused WebSocket upgrade), the sign-in panel that says so and offers a way back, and
// signing out. The token never goes into a URL: the WebSocket carries it in `Sec-WebSocket-Protocol`.

import type { Refusal } from "./rpc";

const TOKEN_KEY = "ahp-relay.token";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

/** The subprotocols a WebSocket offers: the one the relay selects, and the token. */
export function socketProtocols(token: string): string[] {
  return ["ahp.v1", `ahp-relay.bearer.${token}`];
}

/** The token from `#token=…` or `#access_token=…` (then removed from the address bar), else this tab's. */
export function takeToken(): string | undefined {
  const hash = new URLSearchParams(location.hash.slice(1));
  const fromLink = hash.get("token") ?? hash.get("access_token");
  if (fromLink) {
    sessionStorage.setItem(TOKEN_KEY, fromLink);
    for (const key of ["token", "access_token", "token_type", "expires_in", "scope", "state", "id_token"]) hash.delete(key);
    const rest = hash.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
    return fromLink;
  }
  return sessionStorage.getItem(TOKEN_KEY) ?? undefined;
}

/** Forget this tab's token (a reload then asks to sign in instead of retrying it). */
export function forgetToken(): void {
  sessionStorage.removeItem(TOKEN_KEY);
}

/**
 * Why the relay refuses `token` for `host`, or `undefined` when it accepts it (then a failed connection was
 * the network's doing, and retrying can help).
 */
export async function refusal(token: string, host: string | null): Promise<Refusal | undefined> {
  let response: Response;
  try {
    const query = host ? `?host=${encodeURIComponent(host)}` : "";
    response = await fetch(`/v1/auth/check${query}`, { headers: { Authorization: `Bearer ${token}` }, cache: "no-store" });
  } catch {
    return undefined;
  }
  if (response.ok) return undefined;
  if (response.status !== 401 && response.status !== 403) return undefined;
  const body = await response.json().catch(() => ({}));
  const detail = `HTTP ${response.status}: ${String(body.error ?? "refused")}`;
  return { reason: plainReason(detail), detail };
}

/** The relay's reason, said for a person (its own words stay in the panel's details). */
function plainReason(reason: string): string {
  if (/ExpiredSignature|expired/i.test(reason)) return "Your sign-in has expired.";
  if (/does not grant this host/.test(reason)) return "Your account may not open this host.";
  if (/no access token/.test(reason)) return "You are not signed in.";
  return "The relay did not accept your sign-in.";
}

/** Where to send a user to sign in, if the relay has an identity provider's login configured. */
async function signInUrl(): Promise<string | undefined> {
  try {
    const response = await fetch("/v1/web-config", { cache: "no-store" });
    const config = await response.json();
    if (typeof config.signInUrl !== "string" || !config.signInUrl) return undefined;
    return config.signInUrl.replace("{return}", encodeURIComponent(location.href.split("#")[0]));
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
  const why = $("signin-reason");
  why.textContent = reason ?? "";
  why.title = detail ?? "";
  why.hidden = !reason;
  const url = await signInUrl();
  const provider = $<HTMLAnchorElement>("signin-provider");
  provider.hidden = !url;
  if (url) provider.href = url;
  $("signin-token").focus();
}

/** Wires the sign-in form: a pasted token is kept for this tab and the page starts over with it. */
export function wireSignInForm(): void {
  $("signin").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $<HTMLInputElement>("signin-token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    location.reload();
  });
}
