// The page's routes: the place the address bar's fragment names (`#s=<session>&c=<chat>`, beside `host=`), so
// reload, Back, bookmarks and a link pasted to a teammate open the same chat.

/** The place the address bar names (`#s=<session>&c=<chat>`, beside `host=`): reload, Back, bookmarks and a
 * link pasted to a teammate open the same chat. */
export function routeOf(): { session?: string; chat?: string } {
  const hash = new URLSearchParams(location.hash.slice(1));
  return { session: hash.get("s") ?? undefined, chat: hash.get("c") ?? undefined };
}

/** Name `session` and `chat` in the address bar: a new history entry, or in place of the current one. */
export function routeTo(session: string | undefined, chat: string | undefined, replace: boolean): void {
  const hash = new URLSearchParams(location.hash.slice(1));
  hash.delete("token");
  if (session) hash.set("s", session);
  else hash.delete("s");
  if (chat) hash.set("c", chat);
  else hash.delete("c");
  const next = hash.toString();
  if (next === location.hash.slice(1)) return;
  const url = location.pathname + location.search + (next ? `#${next}` : "");
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
}

/** The address of `session` (its default chat), keeping the rest of the fragment (e.g. `host=`). */
export function routeHref(session: string): string {
  const hash = new URLSearchParams(location.hash.slice(1));
  hash.delete("c");
  hash.set("s", session);
  return `#${hash.toString()}`;
}
