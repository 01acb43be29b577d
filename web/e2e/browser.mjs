// Drives the relay's web client in Debian's Chromium with playwright-core (no browser download). Run by
// tests/browser.rs, which starts the relay:
//
//   node web/e2e/browser.mjs flow   <base-url> <token> <out-dir>   the two-device walk-through, screenshots
//   node web/e2e/browser.mjs signin <base-url> <good> <expired> <foreign> <other-host> <secret> <out-dir>  sign-in
//   node web/e2e/browser.mjs form   <base-url> <token> <tenant-dir> <out-dir>   the new-session form
//   node web/e2e/browser.mjs messages <base-url> <token> <out-dir>  copy, edit, retry, long prompts, Markdown
//   node web/e2e/browser.mjs search <base-url> <token> <out-dir>   search sessions by title, find in a chat
//   node web/e2e/browser.mjs reduce <base-url> <in.json> <out.json> the page's WebAssembly reducers on a stream
//   node web/e2e/browser.mjs team   <base-url> <alice> <bob> <viewer> <mallory> <out-dir>  a team's session
//
// Exits 0 when every check holds; otherwise prints what failed and exits 1.

import { chromium } from "playwright-core";
import { createHmac } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual } from "node:util";

const PATIENCE = 20_000;
const FLAGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

const [mode, base, ...rest] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.AHP_TEST_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: FLAGS,
});

function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

/** A page that fails the run on any script error or console error (a CSP violation is one). */
const opened = [];

async function watchedPage(context, name, problems) {
  const page = await context.newPage();
  opened.push([name, page]);
  page.on("pageerror", (error) => problems.push(`${name}: page error: ${error.message}`));
  page.on("console", (message) => {
    // While a context is offline, the page's reconnect attempts fail: expected, and said on the page.
    if (message.type() === "error" && !message.text().includes("ERR_INTERNET_DISCONNECTED")) problems.push(`${name}: console error: ${message.text()}`);
  });
  return page;
}

const online = (page) => page.waitForSelector('#link-state[data-state="online"]', { timeout: PATIENCE });
const chatState = (page) => page.evaluate(() => globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat()));
const transcriptText = (page) => page.locator("#transcript").innerText();

const problems = [];

/**
 * An accessibility pass with axe-core (WCAG 2.x A/AA rules and best practices) over what `page` shows now: any
 * serious or critical violation fails the run; the others are reported in the run's output.
 */
const axeSource = readFileSync(join(dirname(fileURLToPath(import.meta.url)), "../node_modules/axe-core/axe.min.js"), "utf8");
const accessibility = [];
async function accessible(page, view, { serious = true } = {}) {
  if (!(await page.evaluate(() => typeof globalThis.axe !== "undefined"))) await page.evaluate(axeSource);
  const violations = await page.evaluate(async () => {
    const result = await globalThis.axe.run(document, { resultTypes: ["violations"] });
    return result.violations.map((v) => ({ id: v.id, impact: v.impact, nodes: v.nodes.length, target: String(v.nodes[0]?.target ?? "") }));
  });
  accessibility.push({ view, violations });
  const critical = violations.filter((v) => v.impact === "critical" || (serious && v.impact === "serious"));
  check(critical.length === 0, `${view}: no ${serious ? "serious or " : ""}critical accessibility issue (${JSON.stringify(critical)})`);
}

/** Grants notifications to `context` and records each one its pages show (the real Notification still runs). */
async function recordNotifications(context) {
  await context.grantPermissions(["notifications"], { origin: base });
  await context.addInitScript(() => {
    const Real = window.Notification;
    globalThis.__notified = [];
    class Recorded extends Real {
      constructor(title, options) {
        super(title, options);
        globalThis.__notified.push({ title, tag: options?.tag });
      }
    }
    Object.defineProperty(Recorded, "permission", { get: () => Real.permission });
    Recorded.requestPermission = (...args) => Real.requestPermission(...args);
    window.Notification = Recorded;
  });
}
const notified = (page) => page.evaluate(() => globalThis.__notified);

/** In the page: whether the transcript shows its end. */
function atEnd() {
  const t = document.getElementById("transcript");
  return t.scrollHeight - t.scrollTop - t.clientHeight < 2;
}

async function flow(token, outDir) {
  mkdirSync(outDir, { recursive: true });
  const link = `${base}/#token=${encodeURIComponent(token)}`;

  // ── Device A: a desktop browser creates a session with the demo agent and sends a prompt.
  const desktop = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  await recordNotifications(desktop);
  const a = await watchedPage(desktop, "desktop", problems);
  await a.goto(link);
  await online(a);
  check(!(await a.evaluate(() => location.hash.includes("token="))), "the token is removed from the address bar");
  await a.selectOption("#new-session-agent", "demo");
  await a.click("#create-session");
  await a.waitForSelector("#session-view:not([hidden])", { timeout: PATIENCE });
  const session = await a.evaluate(() => globalThis.ahpRelay?.session());
  // The session's header says what it runs on.
  await a.waitForFunction(() => document.getElementById("session-facts").textContent.includes("Demo agent"), null, {
    timeout: PATIENCE,
  });
  const facts = await a.textContent("#session-facts");
  check(facts.includes("default model"), `the header names the agent and model (${facts})`);

  // Record every status the session list showed for the session.
  await a.evaluate((uri) => {
    globalThis.statusesSeen = new Set();
    new MutationObserver(() => {
      const entry = document.querySelector(`#sessions li[data-uri="${uri}"]`);
      if (entry) globalThis.statusesSeen.add(entry.dataset.status);
    }).observe(document.getElementById("sessions"), { subtree: true, childList: true, attributes: true });
  }, session);
  // Record every length the reply had on screen, to see it arrive in parts.
  await a.evaluate(() => {
    globalThis.replyLengths = new Set();
    new MutationObserver(() => {
      const reply = document.querySelector("#transcript .turn .markdown");
      if (reply) globalThis.replyLengths.add(reply.textContent.length);
    }).observe(document.getElementById("transcript"), { subtree: true, childList: true, characterData: true });
  });
  const hostile = `Please use the tool <script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"> then ask for input`;
  await a.fill("#prompt", hostile);
  await a.click("#composer-send");
  await a.waitForSelector("#transcript .markdown >> text=Hello from the demo agent", { timeout: PATIENCE });
  await a.waitForSelector("#pending .confirmation button.approve", { timeout: PATIENCE });
  await accessible(a, "desktop: session with an approval card");
  // The approval card takes room below the transcript, which stays at its end: the newest reply is in view.
  await a.waitForFunction(atEnd, null, { timeout: 5000 });
  // The session waits on the desktop's approval: the list shows it, highlighted, and so does the tab's title.
  await a.waitForSelector(`#sessions li[data-uri="${session}"][data-status="needs input"] .status`, { timeout: PATIENCE });
  check((await a.title()).includes("needs input"), `the tab title says the session needs input (${await a.title()})`);
  // The untitled session is named after its first prompt, in every list.
  await a.waitForFunction(
    (uri) => document.querySelector(`#sessions li[data-uri="${uri}"] .title`)?.textContent.startsWith("Please use the tool <script>"),
    session,
    { timeout: PATIENCE },
  );
  const statuses = await a.evaluate(() => [...globalThis.statusesSeen]);
  check(statuses.includes("working"), `the session list showed the session working while its turn ran (${statuses})`);
  const lengths = await a.evaluate(() => [...globalThis.replyLengths].filter((n) => n > 0));
  check(lengths.length >= 2, `the reply was seen arriving in parts (lengths seen: ${lengths})`);

  // Approve the tool call; the agent runs it and then asks for input.
  await a.click("#pending .confirmation button.approve");
  await a.waitForSelector("#transcript .tool.completed", { timeout: PATIENCE });
  await a.waitForSelector("#pending .input-form", { timeout: PATIENCE });
  // The tool's output and its file edit, shown as a diff whose added line is the prompt, as text.
  const edit = await a.evaluate(() => {
    const box = document.querySelector("#transcript .tool.completed .file-edit");
    return box && {
      path: box.dataset.path,
      added: [...box.querySelectorAll(".diff .add")].map((l) => l.textContent),
      kept: box.querySelectorAll(".diff .same").length,
      elements: box.querySelectorAll("script, img").length,
    };
  });
  check(edit !== null, "the tool's file edit is shown");
  check(edit.path === "/demo/notes.md", `the edit names its file (${edit.path})`);
  check(edit.added.length === 1 && edit.added[0] === `+ ${hostile}\n`, `the diff adds the prompt as text (${edit.added})`);
  check(edit.kept === 3 && edit.elements === 0, "the diff keeps the unchanged lines and creates no elements from the prompt");
  // The card says what is what, in words.
  const card = await a.evaluate(() => {
    const box = document.querySelector("#transcript .tool.completed");
    return { labels: [...box.querySelectorAll(".tool-label")].map((l) => l.textContent), badge: box.querySelector(".badge").textContent };
  });
  check(card.labels.join(",") === "Input,Output", `the tool card labels its input and output (${card.labels})`);
  check(card.badge === "done", `the tool card's state is in words (${card.badge})`);

  // ── Device B: a phone-sized browser opens the same session and sees the same conversation.
  const phone = await browser.newContext({
    viewport: { width: 390, height: 844 },
    deviceScaleFactor: 2,
    isMobile: true,
    hasTouch: true,
  });
  await recordNotifications(phone);
  const b = await watchedPage(phone, "phone", problems);
  await b.goto(link);
  await online(b);
  // The session was named after its first prompt in the phone's list too.
  check(
    (await b.textContent(`#sessions li[data-uri="${session}"] .title`)).startsWith("Please use the tool <script>"),
    "the phone's list names the session after its first prompt",
  );
  // The phone keeps the new-session form folded away until asked for.
  check(!(await b.isVisible("#create-session")), "the phone's new-session form is folded away");
  await accessible(b, "phone: session list");
  await b.click("#new-session-toggle");
  check(await b.isVisible("#create-session"), "asked for, the phone shows the new-session form");
  await accessible(b, "phone: new-session form");
  await b.click("#new-session-toggle");
  check(!(await b.isVisible("#create-session")), "and folds it again");
  check(await a.isVisible("#create-session"), "the desktop shows the form as it is");
  // The phone's user reaches the session with the keyboard alone: Tab to it, Enter.
  let focused = false;
  for (let i = 0; i < 40 && !focused; i++) {
    await b.keyboard.press("Tab");
    focused = await b.evaluate((uri) => document.activeElement?.closest("#sessions li")?.dataset.uri === uri, session);
  }
  check(focused, "the session list is reachable with Tab");
  await b.keyboard.press("Enter");
  await b.waitForSelector("#pending .input-form", { timeout: PATIENCE });
  await b.waitForFunction(atEnd, null, { timeout: 5000 });
  await accessible(b, "phone: session with a question form");
  // The phone's session header is short: the transcript starts near the top; its details are on demand.
  const top = await b.evaluate(() => document.getElementById("transcript").getBoundingClientRect().top);
  check(top < 200, `the phone's header leaves the screen to the conversation (transcript at ${top}px of 844)`);
  check(!(await b.isVisible("#session-facts")) && (await a.isVisible("#session-facts")), "the phone folds the session's details");
  await b.click("#session-details");
  check(await b.isVisible("#session-facts"), "asked for, the phone shows them");
  await b.click("#session-details");
  // No Shift+Enter hint on a touch keyboard; the desktop keeps it.
  const hints = await Promise.all([a, b].map((page) => page.getAttribute("#prompt", "placeholder")));
  check(hints[0].includes("Shift+Enter") && !hints[1].includes("Shift+Enter"), `the prompt hints fit the devices (${hints})`);
  // Both address bars name the open session and chat.
  const chat = await a.evaluate(() => globalThis.ahpRelay?.chat());
  const placeOf = (page) => page.evaluate(() => Object.fromEntries(new URLSearchParams(location.hash.slice(1))));
  for (const [name, page] of [["desktop", a], ["phone", b]]) {
    const place = await placeOf(page);
    check(place.s === session && place.c === chat, `${name}: the address names the session and chat (${JSON.stringify(place)})`);
  }
  await b.waitForFunction(
    async (expected) => JSON.stringify(globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat())) === expected,
    JSON.stringify(await chatState(a)),
    { timeout: PATIENCE },
  );
  check((await transcriptText(a)) === (await transcriptText(b)), "both devices show the same transcript");
  const decided = await b.textContent("#transcript .tool.completed .decided-by");
  check(decided === "Approved on Web (desktop) · dev-user", `the phone sees who approved the tool call, from which device (${decided})`);
  check(await b.locator("#people .person").count() >= 2, "the phone sees both devices connected");

  // ── Cut A's network mid-turn (the agent waits for input); B answers and the turn finishes without A.
  await desktop.setOffline(true);
  await a.waitForFunction(() => document.getElementById("link-state").dataset.state !== "online", null, {
    timeout: PATIENCE,
  });
  // The phone's user scrolls up to read: what arrives then does not move them; a button offers the end.
  check(
    await b.evaluate(() => {
      const t = document.getElementById("transcript");
      return t.scrollHeight > t.clientHeight + 40;
    }),
    "the phone's transcript is taller than its view",
  );
  await b.evaluate(() => {
    const t = document.getElementById("transcript");
    t.scrollTop = 0;
    t.dispatchEvent(new Event("scroll"));
  });
  await b.fill('#pending .input-form input[name="name"]', "Phone");
  await b.click("#pending .input-form button.approve");
  await b.waitForSelector('#transcript .turn-end[data-state="complete"]', { timeout: PATIENCE });
  check((await transcriptText(b)).includes("Nice to meet you, Phone."), "the phone sees the end of the turn");
  const answered = await b.locator("#transcript .input-request").innerText();
  check(
    answered.includes("Phone") && !answered.includes('"Phone"') && answered.includes("answered") && !answered.includes("answer: accept"),
    `the answered question reads as an answer (${answered})`,
  );
  await b.waitForSelector("#jump-latest:not([hidden])", { timeout: PATIENCE });
  check((await b.evaluate(() => document.getElementById("transcript").scrollTop)) === 0, "the phone's reader was not moved");
  await b.click("#jump-latest");
  await b.waitForFunction(atEnd, null, { timeout: 5000 });
  await b.waitForSelector(`#sessions li[data-uri="${session}"][data-status="idle"]`, { state: "attached", timeout: PATIENCE });
  check(!(await b.title()).includes("need"), `once answered the title no longer asks for input (${await b.title()})`);
  check(
    !(await transcriptText(a)).includes("Nice to meet you"),
    "the desktop, offline, has not received the end of the turn",
  );
  check(
    (await a.evaluate(() => document.getElementById("link-state").dataset.state)) !== "online",
    "the desktop says it is not connected",
  );
  // In words; the close code is in the tooltip, not the text (between two attempts).
  await a.waitForFunction(() => document.getElementById("link-state").dataset.state === "offline", null, { timeout: PATIENCE });
  const pill = await a.evaluate(() => ({ text: document.getElementById("link-state").textContent, detail: document.getElementById("link-state").title }));
  check(/^(Offline|Connection lost), retrying in \d+ s$/.test(pill.text), `the desktop says it is offline in words (${pill.text})`);
  check(/closed with code \d+/.test(pill.detail), `the close code is in the tooltip (${pill.detail})`);

  // ── Restore A: it reconnects by itself, resumes from its last serverSeq and ends with B's exact state.
  await desktop.setOffline(false);
  await online(a);
  await a.waitForSelector('#transcript .turn-end[data-state="complete"]', { timeout: PATIENCE });
  const expected = await chatState(b);
  await a.waitForFunction(
    (json) => JSON.stringify(globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat())) === json,
    JSON.stringify(expected),
    { timeout: PATIENCE },
  );
  check(isDeepStrictEqual(await chatState(a), expected), "the desktop's chat state equals the phone's");
  check((await transcriptText(a)) === (await transcriptText(b)), "both devices show the same transcript again");
  const notes = await a.locator("#notes").innerText();
  check(notes.includes("Back online") && !notes.includes("serverSeq"), `the desktop says in words that it resumed (notes: ${notes})`);
  check(
    (await a.locator('#notes li[title^="resumed from serverSeq"]').count()) === 1,
    "the serverSeq it resumed from is in the note's tooltip",
  );

  // ── The agent echoed markup; both pages show it as text and run none of it.
  for (const [name, page] of [
    ["desktop", a],
    ["phone", b],
  ]) {
    check((await page.evaluate(() => globalThis.__xss)) === undefined, `${name}: no injected script ran`);
    check((await page.locator("#transcript img, #transcript script").count()) === 0, `${name}: no injected elements`);
    check(
      (await transcriptText(page)).includes(`<img src=x onerror="window.__xss = 2">`),
      `${name}: the markup is shown as text`,
    );
  }

  // ── Links that keep your place: a link pasted into another tab opens the same chat; reload keeps it; Back
  // returns to the chat after leaving it for the list.
  const shared = await watchedPage(phone, "shared link", problems);
  await shared.goto(`${link}&s=${encodeURIComponent(session)}&c=${encodeURIComponent(chat)}`);
  await shared.waitForFunction((expected) => globalThis.ahpRelay?.chat() === expected, chat, { timeout: PATIENCE });
  await shared.waitForSelector('#transcript .turn-end[data-state="complete"]', { timeout: PATIENCE });
  check((await transcriptText(shared)) === (await transcriptText(b)), "the shared link shows the same transcript");
  await shared.close();
  await a.reload();
  await online(a);
  await a.waitForFunction((expected) => globalThis.ahpRelay?.chat() === expected, chat, { timeout: PATIENCE });
  await a.waitForSelector('#transcript .turn-end[data-state="complete"]', { timeout: PATIENCE });
  check((await a.evaluate(() => document.body.dataset.view)) === "session", "after a reload the desktop shows the same chat");
  // On the phone (one pane), leave the chat for the list, then Back.
  await b.click("#back");
  await b.waitForFunction(() => document.body.dataset.view === "sessions", null, { timeout: PATIENCE });
  check(!(await placeOf(b)).s, "the list's address names no session");
  await b.goBack();
  await b.waitForFunction((expected) => globalThis.ahpRelay?.chat() === expected, chat, { timeout: PATIENCE });
  check((await b.evaluate(() => document.body.dataset.view)) === "session", "Back returns to the chat");
  await b.waitForSelector('#transcript .turn-end[data-state="complete"]', { timeout: PATIENCE });

  // ── A second chat: every tab has its own name; closing it (after a dialog) closes it on both devices.
  const tabLabels = (page) => page.evaluate(() => [...document.querySelectorAll("#chats .tab")].map((t) => t.textContent));
  await a.click("#new-chat");
  await a.waitForFunction((first) => globalThis.ahpRelay?.chat() !== first && document.querySelectorAll("#chats .tab").length === 2, chat, {
    timeout: PATIENCE,
  });
  const second = await a.evaluate(() => globalThis.ahpRelay?.chat());
  await b.waitForFunction(() => document.querySelectorAll("#chats .tab").length === 2, null, { timeout: PATIENCE });
  const labels = await tabLabels(a);
  check(labels.length === 2 && labels[0] !== labels[1] && !labels.includes("Chat"), `the chats have names of their own (${labels})`);
  check(JSON.stringify(await tabLabels(b)) === JSON.stringify(labels), "the phone names them the same");
  check((await a.locator(`#chats .tab-group:has([data-chat="${chat}"]) .tab-close`).count()) === 0, "the default chat cannot be closed");
  await a.click(`#chats .tab-group:has([data-chat="${second}"]) .tab-close`);
  await a.waitForSelector("#confirm-close-chat[open]", { timeout: PATIENCE });
  await a.click("#confirm-close-chat-ok");
  for (const page of [a, b]) {
    await page.waitForFunction(() => document.querySelectorAll("#chats .tab").length === 1, null, { timeout: PATIENCE });
  }
  await a.waitForFunction((expected) => globalThis.ahpRelay?.chat() === expected, chat, { timeout: PATIENCE });
  await a.waitForSelector('#transcript .turn-end[data-state="complete"]', { timeout: PATIENCE });

  // The phone's top bar stays one line while offline.
  const barHeight = () => b.evaluate(() => document.querySelector("header").getBoundingClientRect().height);
  const onlineBar = await barHeight();
  await phone.setOffline(true);
  await b.waitForFunction(() => document.getElementById("link-state").dataset.state === "offline", null, { timeout: PATIENCE });
  const offlineBar = await barHeight();
  check(offlineBar === onlineBar && offlineBar < 56, `the phone's top bar keeps one line offline (${onlineBar} → ${offlineBar} px)`);
  await b.screenshot({ path: join(outDir, "phone-offline.png") });
  await phone.setOffline(false);
  await online(b);

  await a.screenshot({ path: join(outDir, "desktop.png") });
  await b.screenshot({ path: join(outDir, "phone.png") });
  // ── Renaming from one device renames it everywhere (the phone's list shows the new title).
  await a.click("#rename-session-start");
  await a.fill("#rename-session-title", "Tool and question walk-through");
  await a.press("#rename-session-title", "Enter");
  await a.waitForFunction(() => document.getElementById("session-title").textContent === "Tool and question walk-through", null, {
    timeout: PATIENCE,
  });
  await b.waitForFunction(
    (uri) => document.querySelector(`#sessions li[data-uri="${uri}"] .title`)?.textContent === "Tool and question walk-through",
    session,
    { timeout: PATIENCE },
  );
  // The README's pictures of the walk-through.
  await b.waitForFunction(() => document.getElementById("session-title").textContent === "Tool and question walk-through", null, {
    timeout: PATIENCE,
  });
  for (const page of [a, b]) await page.evaluate(() => document.getElementById("transcript").scrollTo(0, 1e9));
  await a.screenshot({ path: join(outDir, "readme-desktop.png") });
  await b.screenshot({ path: join(outDir, "readme-phone.png") });
  // ── The phone's user went back to the list; the desktop starts a turn that needs approval: the phone, not
  // looking at the session, is notified; the desktop, looking at it, is not.
  await b.click("#back");
  await b.waitForFunction(() => document.body.dataset.view === "sessions", null, { timeout: PATIENCE });
  await a.fill("#prompt", "use the tool once more");
  await a.click("#composer-send");
  await a.waitForSelector("#pending .confirmation button.deny", { timeout: PATIENCE });
  await b.waitForFunction(() => globalThis.__notified.length > 0, null, { timeout: PATIENCE });
  // The desktop has seen the session start waiting too (so a notification it wrongly showed would be there).
  await a.waitForSelector(`#sessions li[data-uri="${session}"][data-status="needs input"]`, { timeout: PATIENCE });
  const phoneNotes = await notified(b);
  check(
    phoneNotes.length === 1 && phoneNotes[0].tag === session && phoneNotes[0].title === "Tool and question walk-through needs input",
    `the phone is notified once that the session needs input (${JSON.stringify(phoneNotes)})`,
  );
  check((await notified(a)).length === 0, "the desktop, looking at the session, is not notified");
  await a.click("#pending .confirmation button.deny");
  await a.waitForFunction(() => document.querySelector("#transcript .tool.cancelled .decided-by")?.textContent === "Denied on Web (desktop) · dev-user", null, {
    timeout: PATIENCE,
  });
  await b.goBack();
  await b.waitForFunction((expected) => globalThis.ahpRelay?.chat() === expected, chat, { timeout: PATIENCE });

  // ── Disposing asks first, in a real dialog; the phone, which had the session open, is told.
  await a.click("#dispose-session");
  await a.waitForSelector("#confirm-dispose[open]", { timeout: PATIENCE });
  await accessible(a, "desktop: dispose dialog");
  await a.click("#confirm-dispose-cancel");
  check(!(await a.isVisible("#confirm-dispose")), "keeping it closes the dialog");
  check((await a.evaluate(() => globalThis.ahpRelay?.session())) === session, "and keeps the session");
  await a.click("#dispose-session");
  await a.waitForSelector("#confirm-dispose[open]", { timeout: PATIENCE });
  await a.click("#confirm-dispose-ok");
  await a.waitForFunction((uri) => !document.querySelector(`#sessions li[data-uri="${uri}"]`), session, { timeout: PATIENCE });
  await b.waitForFunction(() => document.body.dataset.view === "sessions", null, { timeout: PATIENCE });
  const told = await b.locator("#notes").innerText();
  check(told.includes("was disposed on another device"), `the phone is told the session went (notes: ${told})`);
  const mine = await a.locator("#notes").innerText();
  check(!mine.includes("was disposed on another device"), "the desktop, which disposed it, is not told it happened elsewhere");
  check(problems.length === 0, `no page errors:\n${problems.join("\n")}`);
  console.log(JSON.stringify({ session, accessibility, screenshots: [join(outDir, "desktop.png"), join(outDir, "phone.png")] }));
}

/** A token like `model` (its claims) expiring `seconds` from now, signed with the relay's HS256 `secret`. */
function tokenExpiringIn(model, secret, seconds) {
  const claims = JSON.parse(Buffer.from(model.split(".")[1], "base64url").toString());
  const now = Math.floor(Date.now() / 1000);
  const part = (value) => Buffer.from(JSON.stringify(value)).toString("base64url");
  const unsigned = `${part({ alg: "HS256", typ: "JWT" })}.${part({ ...claims, iat: now, exp: now + seconds })}`;
  return `${unsigned}.${createHmac("sha256", secret).update(unsigned).digest("base64url")}`;
}

/**
 * Sign-in that recovers: a refused token says why and asks for another (and a reload does not retry it); the
 * token is never in a WebSocket URL or the console; an identity provider's login returns with a token (and the
 * `state` it was given, else it is refused) to the place the page showed; signing out forgets the token; a
 * token expiring on an open connection brings the sign-in back; a token refused only for this host is kept.
 */
async function signin(good, expired, foreign, otherHost, secret, outDir) {
  mkdirSync(outDir, { recursive: true });
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  opened.push(["signin", page]);
  const consoleLines = [];
  const sockets = [];
  page.on("console", (message) => consoleLines.push(message.text()));
  page.on("pageerror", (error) => problems.push(`signin: page error: ${error.message}`));
  page.on("websocket", (socket) => sockets.push(socket.url()));
  const signInShown = () => page.waitForSelector('body[data-view="signin"] #signin-token', { timeout: PATIENCE });
  const reasonOf = async () => ({ text: await page.textContent("#signin-reason"), detail: await page.getAttribute("#signin-reason", "title") });
  const shortLived = [];

  // Issue 36 (10): this relay signs in through an identity provider, so a link with a token signs nobody in:
  // refused, said why, and no socket is opened with it.
  await page.goto(`${base}/#token=${encodeURIComponent(good)}&s=${encodeURIComponent("ahp-session:/senders")}`);
  await signInShown();
  check((await page.textContent("#signin-reason")).includes("identity provider"), `a link's token is refused where an identity provider signs in (${await page.textContent("#signin-reason")})`);
  check(!(await page.evaluate(() => location.hash.includes("token="))), "the refused token is removed from the address bar");
  check(sockets.length === 0, `no socket was opened with the link's token (${sockets.length})`);
  // Nor does an identity provider's answer that no sign-in of this tab asked for.
  await page.goto(`${base}/#access_token=${encodeURIComponent(good)}&token_type=bearer`);
  await page.reload();
  await signInShown();
  check((await page.textContent("#signin-reason")).includes("did not ask for"), `an unsolicited answer is refused (${await page.textContent("#signin-reason")})`);
  check(sockets.length === 0, `no socket was opened with the unsolicited answer (${sockets.length})`);

  // A foreign token (signed by someone else), pasted: refused, said why, not retried.
  const paste = async (target, token) => {
    await target.fill("#signin-token", token);
    await Promise.all([target.waitForEvent("load"), target.click("#signin-submit")]);
  };
  await paste(page, foreign);
  await signInShown();
  await page.waitForSelector("#signin-reason:not([hidden])", { timeout: PATIENCE });
  let reason = await reasonOf();
  check(reason.text.includes("did not accept your sign-in") && reason.detail.includes("HTTP 401"), `a foreign token is refused with its reason (${JSON.stringify(reason)})`);
  check((await page.getAttribute("#link-state", "data-state")) === "refused", "the connection says it is refused");
  check((await page.textContent("#link-state")) === "Sign-in refused", `the pill says the sign-in was refused (${await page.textContent("#link-state")})`);
  check(sockets.length === 1, `the refused token was tried once, not retried (${sockets.length} sockets)`);
  await accessible(page, "sign-in with a reason");
  // A reload does not reuse it: the page asks to sign in and opens no socket.
  await page.reload();
  await signInShown();
  check(await page.isHidden("#signin-reason"), "after a reload the page simply asks to sign in");
  check(sockets.length === 1, `the reload opened no socket with the refused token (${sockets.length} sockets)`);

  // Something that is not a token at all is said so at once, without a connection.
  await page.fill("#signin-token", "my password");
  await page.click("#signin-submit");
  await page.waitForSelector("#signin-reason:not([hidden])", { timeout: PATIENCE });
  check((await page.textContent("#signin-reason")).includes("not an access token"), "a non-token is refused in the page");
  check((await page.textContent("#link-state")) === "Not signed in", `the pill does not say "starting" (${await page.textContent("#link-state")})`);
  check(sockets.length === 1, "and opens no socket");

  // An expired token pasted in (with a `Bearer ` prefix, which is dropped): refused as expired.
  await page.fill("#signin-token", `Bearer ${expired}`);
  await Promise.all([page.waitForEvent("load"), page.click("#signin-submit")]);
  await page.waitForSelector('#signin-reason:not([hidden])', { timeout: PATIENCE });
  reason = await reasonOf();
  check(reason.text.includes("expired"), `an expired token is said to be expired (${JSON.stringify(reason)})`);
  check((await page.textContent("#link-state")) === "Sign-in expired", `the pill says the sign-in expired (${await page.textContent("#link-state")})`);

  // The identity provider's login (configured with --sign-in-url) returns with a token in the fragment and the
  // state it was given; an answer with another state is refused. The page comes back to where it was.
  // The link is made once the page has the relay's configuration (fetched after the reason shows).
  await page.waitForSelector('#signin-provider[href^="https://idp.example/"]', { timeout: PATIENCE });
  const provider = await page.getAttribute("#signin-provider", "href");
  check(provider.startsWith(`https://idp.example/login?return=${encodeURIComponent(`${base}/`)}&state=`), `the sign-in link goes to the provider with the way back (${provider})`);
  let forgeState = true;
  await page.route("https://idp.example/**", (route) => {
    const state = new URL(route.request().url()).searchParams.get("state");
    const answer = forgeState ? "someone-elses" : state;
    route.fulfill({ status: 302, headers: { location: `${base}/#access_token=${encodeURIComponent(good)}&token_type=bearer&state=${answer}` } });
  });
  await page.click("#signin-provider");
  await page.waitForSelector('#signin-reason:not([hidden])', { timeout: PATIENCE });
  check((await page.textContent("#signin-reason")).includes("did not match"), "an answer with another state is refused");
  // The refused answer leaves the sign-in waiting for its own: an answer without a state is not taken either.
  const socketsBefore = sockets.length;
  await page.goto(`${base}/#access_token=${encodeURIComponent(good)}&token_type=bearer`);
  await page.reload();
  await page.waitForSelector('#signin-reason:not([hidden])', { timeout: PATIENCE });
  check((await page.textContent("#signin-reason")).includes("did not match"), "after a mismatch, an answer without the state is refused");
  check(sockets.length === socketsBefore, "and opens no socket");
  forgeState = false;
  await page.evaluate(() => { location.hash = "s=ahp-session%3A%2Fsomewhere&c=ahp-chat%3A%2Fthere"; });
  await page.click("#signin-provider");
  await online(page);
  const place = await page.evaluate(() => Object.fromEntries(new URLSearchParams(location.hash.slice(1))));
  check(!("access_token" in place) && !("state" in place), `the provider's answer is removed from the address bar (${JSON.stringify(place)})`);
  check(place.s === "ahp-session:/somewhere" && place.c === "ahp-chat:/there", `the page is back where it was (${JSON.stringify(place)})`);
  await page.screenshot({ path: join(outDir, "signed-in.png") });

  // Sign out: the page forgets the token; a reload stays signed out.
  const before = sockets.length;
  await page.click("#sign-out");
  await signInShown();
  check((await page.textContent("#signin-reason")).includes("signed out"), "signing out says so");
  check((await page.title()) === "Sign in · ahp-relay", `signed out, the tab's title carries no session's news (${await page.title()})`);
  await page.reload();
  await signInShown();
  check(sockets.length === before, "signed out, a reload opens no socket");

  // A token that expires while connected: the relay closes with 4001 and the page asks to sign in again.
  shortLived.push(tokenExpiringIn(good, secret, 4));
  await page.fill("#signin-token", shortLived[0]);
  await Promise.all([page.waitForEvent("load"), page.click("#signin-submit")]);
  await online(page);
  // Issue 36 (11): before it ends, the page says when.
  await page.waitForSelector("#expiry-warning:not([hidden])", { timeout: PATIENCE });
  check((await page.textContent("#expiry-warning")).includes("Your sign-in ends at"), `a warning before the sign-in expires (${await page.textContent("#expiry-warning")})`);
  await page.waitForSelector('#signin-reason:not([hidden])', { timeout: PATIENCE });
  check(await page.isHidden("#expiry-warning"), "signed out, the warning goes");
  reason = await reasonOf();
  check(reason.text.includes("expired") && reason.detail.includes("4001"), `an expiry on an open connection asks to sign in again (${JSON.stringify(reason)})`);
  await page.screenshot({ path: join(outDir, "signin.png") });
  // What was typed survives an expired sign-in: signed in again, the chat's box holds it.
  shortLived.push(tokenExpiringIn(good, secret, 12));
  await keepsDraftThroughExpiry(page, shortLived.at(-1), good, "typed before the sign-in ended");

  // A token refused only for this host (403) is kept: the same tab opens the host it grants.
  await page.goto(`${base}/`);
  await signInShown();
  await paste(page, otherHost);
  await page.waitForSelector('#signin-reason:not([hidden])', { timeout: PATIENCE });
  reason = await reasonOf();
  check(reason.text.includes("may not open this host") && reason.detail.includes("HTTP 403"), `a token for another host says so (${JSON.stringify(reason)})`);
  await page.goto(`${base}/#host=other`);
  await page.reload();
  await online(page);


  // On a phone: an expired link shows the sign-in panel with its reason, in view, and a pasted token works.
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  const b = await watchedPhoneSignIn(phone);
  const phoneSockets = [];
  b.on("websocket", (socket) => phoneSockets.push(socket.url()));
  b.on("console", (message) => consoleLines.push(message.text()));
  const phoneSignIn = () => b.waitForSelector('body[data-view="signin"] #signin-token', { timeout: PATIENCE });
  const phonePill = async () => ({ text: await b.textContent("#link-state"), shown: await b.isVisible("#link-state") });
  // A link's token is refused on the phone too (this relay signs in through an identity provider).
  await b.goto(`${base}/#token=${encodeURIComponent(good)}`);
  await phoneSignIn();
  check((await b.textContent("#signin-reason")).includes("identity provider"), "the phone refuses a link's token");
  check(phoneSockets.length === 0, `and opens no socket with it (${phoneSockets.length})`);
  // Nor an identity provider's answer this phone did not ask for.
  await b.goto(`${base}/#access_token=${encodeURIComponent(good)}&token_type=bearer`);
  await b.reload();
  await phoneSignIn();
  check((await b.textContent("#signin-reason")).includes("did not ask for"), `the phone refuses an unsolicited answer (${await b.textContent("#signin-reason")})`);
  check(phoneSockets.length === 0, `and opens no socket with it (${phoneSockets.length})`);
  // A forged answer (another state) is refused, and the sign-in keeps waiting for its own.
  await b.route("https://idp.example/**", (route) =>
    route.fulfill({ status: 302, headers: { location: `${base}/#access_token=${encodeURIComponent(good)}&token_type=bearer&state=someone-elses` } }),
  );
  await b.waitForSelector('#signin-provider[href^="https://idp.example/"]', { timeout: PATIENCE });
  await b.click("#signin-provider");
  await b.waitForFunction(() => document.getElementById("signin-reason").textContent.includes("did not match"), null, { timeout: PATIENCE });
  await b.goto(`${base}/#access_token=${encodeURIComponent(good)}&token_type=bearer`);
  await b.reload();
  await b.waitForFunction(() => document.getElementById("signin-reason").textContent.includes("did not match"), null, { timeout: PATIENCE });
  check(phoneSockets.length === 0, `after a mismatch the phone takes no answer without the state either (${phoneSockets.length} sockets)`);
  let pill = await phonePill();
  check(pill.text === "Not signed in" && pill.shown, `the phone's pill says it is not signed in (${JSON.stringify(pill)})`);
  await paste(b, foreign);
  await b.waitForSelector('#signin-reason:not([hidden])', { timeout: PATIENCE });
  pill = await phonePill();
  check(pill.text === "Sign-in refused" && pill.shown, `the phone's pill says the sign-in was refused (${JSON.stringify(pill)})`);
  await paste(b, expired);
  await b.waitForSelector('#signin-reason:not([hidden])', { timeout: PATIENCE });
  check((await b.textContent("#signin-reason")).includes("expired"), "the phone says the sign-in expired");
  pill = await phonePill();
  check(pill.text === "Sign-in expired" && pill.shown, `the phone's pill says the sign-in expired (${JSON.stringify(pill)})`);
  check(await b.evaluate(() => document.getElementById("signin-submit").getBoundingClientRect().bottom <= window.innerHeight), "the phone's sign-in form is in view");
  await accessible(b, "phone: sign-in with a reason");
  shortLived.push(tokenExpiringIn(good, secret, 12));
  await keepsDraftThroughExpiry(b, shortLived.at(-1), good, "typed on the phone before it ended");
  // A token that ends within five minutes: the phone warns, in view; signing out clears the tab's title.
  shortLived.push(tokenExpiringIn(good, secret, 120));
  await b.fill("#signin-token", shortLived[shortLived.length - 1]);
  await Promise.all([b.waitForEvent("load"), b.click("#signin-submit")]);
  await online(b);
  await b.waitForSelector("#expiry-warning:not([hidden])", { timeout: PATIENCE });
  check(
    await b.evaluate(() => {
      const warning = document.getElementById("expiry-warning").getBoundingClientRect();
      return warning.top >= 0 && warning.bottom <= window.innerHeight && warning.width > 0;
    }),
    "the phone shows the warning before the sign-in ends, in view",
  );
  await b.click("#sign-out");
  await phoneSignIn();
  check((await b.title()) === "Sign in · ahp-relay", `signed out, the phone's tab title carries no session's news (${await b.title()})`);
  await b.fill("#signin-token", good);
  await Promise.all([b.waitForEvent("load"), b.click("#signin-submit")]);
  await online(b);
  // No token, of either page, was ever in a WebSocket URL or the console.
  const allSockets = [...sockets, ...phoneSockets];
  for (const token of [good, expired, foreign, otherHost, ...shortLived]) {
    check(!allSockets.some((url) => url.includes(token)), "no WebSocket URL carries a token");
    check(!consoleLines.some((line) => line.includes(token)), "no console line carries a token");
  }
  check(!allSockets.some((url) => url.includes("access_token")), `no WebSocket URL has an access_token (${allSockets})`);
  check(problems.length === 0, `no page errors:\n${problems.join("\n")}`);
  console.log(JSON.stringify({ sockets: sockets.length, accessibility }));
}

/**
 * Sign in on `page` with `shortLived`, open a new demo session and type `text` in its box; once the sign-in
 * has expired, sign in with `good`: the same session's box holds the text. Signs out at the end.
 */
async function keepsDraftThroughExpiry(page, shortLived, good, text) {
  await page.fill("#signin-token", shortLived);
  await Promise.all([page.waitForEvent("load"), page.click("#signin-submit")]);
  await online(page);
  if (!(await page.isVisible("#create-session"))) await page.click("#new-session-toggle");
  await page.selectOption("#new-session-agent", "demo");
  await page.click("#create-session");
  await page.waitForFunction(() => !!globalThis.ahpRelay?.chat(), null, { timeout: PATIENCE });
  const chat = await page.evaluate(() => globalThis.ahpRelay?.chat());
  await page.fill("#prompt", text);
  await page.waitForSelector('body[data-view="signin"] #signin-reason:not([hidden])', { timeout: PATIENCE });
  check((await page.textContent("#signin-reason")).includes("expired"), "the short sign-in expired");
  await page.fill("#signin-token", good);
  await Promise.all([page.waitForEvent("load"), page.click("#signin-submit")]);
  await online(page);
  await page.waitForFunction((c) => globalThis.ahpRelay?.chat() === c, chat, { timeout: PATIENCE });
  await page.waitForFunction((t) => document.getElementById("prompt").value === t, text, { timeout: PATIENCE });
  // Signed out again, for what the caller checks next.
  await page.click("#sign-out");
  await page.waitForSelector('body[data-view="signin"] #signin-token', { timeout: PATIENCE });
}

/** A phone page for the sign-in scenario: refused connections log console errors there, by design. */
async function watchedPhoneSignIn(context) {
  const page = await context.newPage();
  opened.push(["signin phone", page]);
  page.on("pageerror", (error) => problems.push(`signin phone: page error: ${error.message}`));
  return page;
}

/**
 * The new-session form: it names the tenant's part of the workspace, takes a name under it, and says what is
 * wrong next to the field (on a phone too) instead of in the notes.
 */
async function form(token, tenantDir, outDir) {
  mkdirSync(outDir, { recursive: true });
  const link = `${base}/#token=${encodeURIComponent(token)}`;
  const desktop = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const a = await watchedPage(desktop, "desktop", problems);
  // The relay's refusals are answers, not page errors.
  await a.goto(link);
  await online(a);
  const root = await a.textContent("#new-session-root");
  check(root.includes(`${tenantDir}/`), `the form names the allowed root (${root})`);
  const besideField = (page) =>
    page.evaluate(() => {
      const field = document.getElementById("new-session-dir").getBoundingClientRect();
      const error = document.getElementById("new-session-error").getBoundingClientRect();
      return error.top >= field.bottom && error.top - field.bottom < 80 && error.bottom <= window.innerHeight;
    });
  // Outside the workspace: refused by the relay, said next to the field; no session is made.
  await a.selectOption("#new-session-agent", "scripted");
  await a.fill("#new-session-dir", "/etc");
  await a.click("#create-session");
  await a.waitForSelector("#new-session-error:not([hidden])", { timeout: PATIENCE });
  const refused = await a.textContent("#new-session-error");
  check(refused.includes("outside"), `the refusal says why (${refused})`);
  check(await besideField(a), "the refusal is next to the field");
  check((await a.getAttribute("#new-session-dir", "aria-invalid")) === "true", "the field is marked invalid");
  check((await a.locator("#sessions li").count()) === 0, "no session was made");
  // A name under the root: the session works there.
  await a.fill("#new-session-dir", "myproject");
  await a.click("#create-session");
  await a.waitForSelector("#session-view:not([hidden])", { timeout: PATIENCE });
  await a.waitForFunction((dir) => document.getElementById("session-facts").textContent.includes(dir), `${tenantDir}/myproject`, {
    timeout: PATIENCE,
  });
  check(await a.isHidden("#new-session-error"), "the error is gone once the directory is right");
  await a.screenshot({ path: join(outDir, "form-desktop.png") });

  // The session's files (the test put a README and src/main.rs in its folder): listed, walked, shown.
  const entries = (page) => page.evaluate(() => [...document.querySelectorAll("#files-list .file-entry")].map((e) => e.dataset.name));
  await a.click("#files-toggle");
  await a.waitForSelector('#files-list .file-entry[data-name="README.md"]', { timeout: PATIENCE });
  // (The agent keeps a dot-file of its own there too.)
  const listed = (await entries(a)).filter((name) => !name.startsWith("."));
  check(JSON.stringify(listed) === JSON.stringify(["src", "README.md"]), `folders first, then files (${await entries(a)})`);
  check(await a.isHidden("#composer"), "the files take the conversation's place");
  await a.click('#files-list .file-entry[data-name="src"]');
  await a.waitForSelector('#files-list .file-entry[data-name="main.rs"]', { timeout: PATIENCE });
  await a.click('#files-list .file-entry[data-name="main.rs"]');
  await a.waitForSelector("#file-view pre code", { timeout: PATIENCE });
  const shown = await a.evaluate(() => ({
    text: document.querySelector("#file-view pre code").textContent,
    keywords: [...document.querySelectorAll("#file-view .hljs-keyword")].map((k) => k.textContent),
  }));
  check(shown.text === 'fn main() {\n    println!("hello from the workspace");\n}\n', `the file is shown as it is (${JSON.stringify(shown.text)})`);
  check(shown.keywords.includes("fn"), `and highlighted (${shown.keywords})`);
  await accessible(a, "desktop: the session's files");
  await a.screenshot({ path: join(outDir, "files-desktop.png") });
  await a.click("#files-up");
  await a.waitForSelector('#files-list .file-entry[data-name="README.md"]', { timeout: PATIENCE });
  check(await a.isDisabled("#files-up"), "the session's folder is the top");
  await a.click("#files-toggle");
  check(await a.isVisible("#composer"), "closing the files brings the conversation back");

  // On a phone: the form opens on demand and its errors show beside the field, in view.
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  const b = await watchedPage(phone, "phone", problems);
  await b.goto(link);
  await online(b);
  await b.click("#new-session-toggle");
  await b.selectOption("#new-session-agent", "scripted");
  await b.fill("#new-session-dir", "../elsewhere");
  await b.click("#create-session");
  await b.waitForSelector("#new-session-error:not([hidden])", { timeout: PATIENCE });
  check((await b.textContent("#new-session-error")).includes(".."), "the phone is told a name may not leave the root");
  check(await besideField(b), "on the phone the error is next to the field, in view");
  await b.fill("#new-session-dir", "/tmp");
  await b.click("#create-session");
  await b.waitForFunction(() => document.getElementById("new-session-error").textContent.includes("outside"), null, { timeout: PATIENCE });
  check(await besideField(b), "the relay's refusal too");
  await accessible(b, "phone: new-session form with an error");
  // The phone opens the desktop's session and reads its README.
  const made = await a.evaluate(() => globalThis.ahpRelay?.session());
  await b.click(`#sessions li[data-uri="${made}"] a`);
  await b.waitForSelector("#files-toggle:not([hidden])", { timeout: PATIENCE });
  await b.click("#files-toggle");
  await b.click('#files-list .file-entry[data-name="README.md"]');
  await b.waitForSelector("#file-view pre code", { timeout: PATIENCE });
  check((await b.textContent("#file-view pre code")) === "# My project\n", "the phone reads the README");
  check(
    await b.evaluate(() => document.getElementById("file-view").getBoundingClientRect().top < window.innerHeight),
    "the phone shows the file in view",
  );
  await b.screenshot({ path: join(outDir, "files-phone.png") });
  await b.screenshot({ path: join(outDir, "form-phone.png") });
  check(problems.length === 0, `no page errors:\n${problems.join("\n")}`);
  console.log(JSON.stringify({ session: await a.evaluate(() => globalThis.ahpRelay?.session()), accessibility }));
}

/**
 * Messages: Markdown tables, quotes and highlighted code with a copy button; copying a reply; a long prompt
 * folded with "Show more"; retrying the last turn and editing a sent prompt (truncate + resend), seen alike on
 * a phone.
 */
async function messages(token, outDir) {
  mkdirSync(outDir, { recursive: true });
  const link = `${base}/#token=${encodeURIComponent(token)}`;
  const desktop = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  await desktop.grantPermissions(["clipboard-read", "clipboard-write"], { origin: base });
  const a = await watchedPage(desktop, "desktop", problems);
  const clipboard = () => a.evaluate(() => navigator.clipboard.readText());
  const turns = (page) => page.evaluate(() => globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat())?.turns ?? []);
  const idleWith = (page, count) =>
    page.waitForFunction(
      (n) => {
        const chat = globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat());
        return chat && !chat.activeTurn && (chat.turns ?? []).length === n;
      },
      count,
      { timeout: PATIENCE },
    );
  await a.goto(link);
  await online(a);
  await a.selectOption("#new-session-agent", "demo");
  await a.click("#create-session");
  await a.waitForSelector("#session-view:not([hidden])", { timeout: PATIENCE });
  await a.fill("#prompt", "show markdown please");
  await a.click("#composer-send");
  await idleWith(a, 1);
  await a.waitForSelector("#transcript .reply-actions .copy-reply", { timeout: PATIENCE });

  // Markdown: a table, a quote, a code block highlighted (as spans, not HTML) with its own copy button.
  const rendered = await a.evaluate(() => {
    const reply = document.querySelector("#transcript .turn .reply");
    return {
      headers: [...reply.querySelectorAll(".table th")].map((th) => th.textContent),
      cells: [...reply.querySelectorAll(".table td")].map((td) => td.textContent),
      centered: reply.querySelector(".table td:nth-child(2)")?.style.textAlign,
      quote: reply.querySelector("blockquote")?.textContent.trim(),
      code: reply.querySelector(".code-block code")?.textContent,
      keywords: [...reply.querySelectorAll(".code-block code .hljs-keyword")].map((k) => k.textContent),
      strings: reply.querySelectorAll(".code-block code .hljs-string").length,
    };
  });
  check(rendered.headers.join(",") === "Step,State" && rendered.cells.join(",") === "build,done,test,running", `the table is a table (${JSON.stringify(rendered)})`);
  check(rendered.centered === "center", "the table keeps its column alignment");
  check(rendered.quote === "Quoted from the plan.", `the quote is a block quote (${rendered.quote})`);
  const code = 'fn main() {\n    let answer = 42;\n    println!("{answer}");\n}';
  check(rendered.code === code, `the code is shown as written (${JSON.stringify(rendered.code)})`);
  check(rendered.keywords.includes("fn") && rendered.keywords.includes("let") && rendered.strings > 0, `the code is highlighted (${rendered.keywords})`);
  await a.click("#transcript .code-block .copy-code");
  await a.waitForSelector("#transcript .code-block .copy-code >> text=Copied", { timeout: PATIENCE });
  check((await clipboard()) === code, "the code's copy button copies the code");
  await a.click("#transcript .reply-actions .copy-reply");
  await a.waitForSelector("#transcript .reply-actions .copy-reply >> text=Copied", { timeout: PATIENCE });
  const replyText = (await turns(a))[0].responseParts.filter((p) => p.kind === "markdown").map((p) => p.content).join("\n\n");
  check((await clipboard()) === replyText, "Copy copies the reply as the agent wrote it");
  // Find in chat finds text that highlighting split into several spans.
  await a.fill("#find-in-chat", "let answer");
  await a.waitForFunction(() => document.getElementById("find-count").textContent === "1 match", null, { timeout: PATIENCE });
  await a.fill("#find-in-chat", "");
  // The renderer always finishes and never makes markup from text: random Markdown-ish input, line separators
  // (U+2028) included.
  const fuzz = await a.evaluate(() => {
    const alphabet = ["#", "# ", "\u2028", "\u2029", "|", "---", ":", "-", ">", "```", "~~~", "*", "_", "`", "[", "]", "(", ")", "\n", " ", "a", "1.", "<img src=x onerror=alert(1)>", "http://x", "\\|"];
    let seed = 7;
    const next = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
    const allowed = new Set(["p", "h3", "h4", "h5", "h6", "ul", "ol", "li", "blockquote", "div", "span", "button", "pre", "code", "table", "thead", "tbody", "tr", "th", "td", "strong", "em", "a"]);
    let cases = 0;
    for (; cases < 3000; cases++) {
      const parts = Array.from({ length: 1 + (next() % 24) }, () => alphabet[next() % alphabet.length]);
      const { tags } = globalThis.ahpRelay?.markdown(parts.join(""));
      const stray = tags.filter((t) => !allowed.has(t));
      if (stray.length > 0) return { cases, stray, input: parts.join("") };
    }
    return { cases };
  });
  check(fuzz.cases === 3000 && !fuzz.stray, `the Markdown renderer survives 3000 random inputs (${JSON.stringify(fuzz)})`);
  await a.screenshot({ path: join(outDir, "markdown.png") });
  await accessible(a, "desktop: Markdown reply with code");

  // A long prompt is folded, on the phone too, until asked.
  const long = Array.from({ length: 20 }, (_, i) => `line ${i + 1} of a long prompt`).join("\n");
  await a.fill("#prompt", long);
  await a.click("#composer-send");
  await idleWith(a, 2);
  const session = await a.evaluate(() => globalThis.ahpRelay?.session());
  const chat = await a.evaluate(() => globalThis.ahpRelay?.chat());
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  await phone.grantPermissions(["clipboard-read", "clipboard-write"], { origin: base });
  const b = await watchedPage(phone, "phone", problems);
  await b.goto(`${link}&s=${encodeURIComponent(session)}&c=${encodeURIComponent(chat)}`);
  await online(b);
  await idleWith(b, 2);
  const folded = (page) =>
    page.evaluate(() => {
      const prompt = document.querySelectorAll("#transcript .turn .user")[1];
      return { folded: prompt.classList.contains("folded"), clipped: prompt.scrollHeight > prompt.clientHeight + 4 };
    });
  for (const [name, page] of [["desktop", a], ["phone", b]]) {
    const seen = await folded(page);
    check(seen.folded && seen.clipped, `${name}: the long prompt is folded (${JSON.stringify(seen)})`);
  }
  check((await folded(a)).folded && (await a.locator("#transcript .turn").first().locator(".show-more").count()) === 0, "a short prompt is not folded");
  await b.locator("#transcript .turn").nth(1).locator(".show-more").click();
  const unfolded = await folded(b);
  check(!unfolded.folded && !unfolded.clipped, `asked, the phone shows all of it (${JSON.stringify(unfolded)})`);

  // The phone copies a reply too.
  await b.locator("#transcript .turn").first().locator(".copy-reply").click();
  await b.waitForSelector("#transcript .turn:first-child .copy-reply >> text=Copied", { timeout: PATIENCE });
  check((await b.evaluate(() => navigator.clipboard.readText())) === replyText, "the phone copies the reply");

  // Issue 36 (3): the phone retries the last turn on a branch: a new chat forked through the turn before it runs
  // the prompt again; the chat it came from keeps both turns, on both devices.
  const before = await turns(a);
  const chatsOf = (page) => page.evaluate(() => globalThis.ahpRelay?.state(globalThis.ahpRelay?.session())?.chats?.map((c) => c.resource) ?? []);
  await b.locator("#transcript .turn").last().locator(".retry-turn").click();
  await b.waitForFunction((first) => globalThis.ahpRelay?.chat() !== first, chat, { timeout: PATIENCE });
  const retryChat = await b.evaluate(() => globalThis.ahpRelay?.chat());
  await idleWith(b, 2);
  const retried = await turns(b);
  check(retried[0].message.text === before[0].message.text && retried[1].message.text === long && retried[1].state === "complete" && retried[1].id !== before[1].id, "retry ran the last prompt again on a branch that keeps the turn before it");
  await a.waitForFunction((uri) => globalThis.ahpRelay?.state(globalThis.ahpRelay?.session())?.chats?.some((c) => c.resource === uri), retryChat, { timeout: PATIENCE });
  check(isDeepStrictEqual((await turns(a)).map((t) => t.id), before.map((t) => t.id)), "the chat retried from keeps every turn");
  check((await a.locator("#transcript .turn").first().locator(".retry-turn").count()) === 0, "only the last turn offers a retry");
  check((await a.locator("#transcript .turn .fork-turn").count()) === 2, "every completed turn offers Fork");

  // Edit the first prompt, sent with Enter: a new chat starts from the edited prompt; the original keeps its turns.
  const chatsBefore = await chatsOf(a);
  await a.locator("#transcript .turn").first().locator(".edit-prompt").click();
  await a.fill("#transcript .edit-box", "show markdown again");
  await a.press("#transcript .edit-box", "Enter");
  await a.waitForFunction((known) => !known.includes(globalThis.ahpRelay?.chat()), chatsBefore, { timeout: PATIENCE });
  await a.waitForFunction(() => {
    const chat = globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat());
    return chat && !chat.activeTurn && chat.turns.length === 1 && chat.turns[0].message.text === "show markdown again";
  }, null, { timeout: PATIENCE });
  const edited = await a.evaluate(() => globalThis.ahpRelay?.chat());
  await b.click(`#chats .tab[data-chat="${edited}"]`);
  await b.waitForFunction(
    (expected) => JSON.stringify(globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat())) === expected,
    JSON.stringify(await chatState(a)),
    { timeout: PATIENCE },
  );
  // The state arrived; the transcript is drawn at the next frame.
  const editedText = await transcriptText(a);
  const shown = await b
    .waitForFunction((text) => document.querySelector("#transcript")?.innerText === text, editedText, { timeout: PATIENCE })
    .then(() => true, () => false);
  check(shown, "the phone shows the edited branch");
  await b.click(`#chats .tab[data-chat="${chat}"]`);
  await idleWith(b, 2);
  check(isDeepStrictEqual((await turns(b)).map((t) => t.id), before.map((t) => t.id)), "the edited chat keeps every turn");
  // Fork on a turn: a new chat with the turns through it.
  await b.locator("#transcript .turn").first().locator(".fork-turn").click();
  await b.waitForFunction((known) => !known.includes(globalThis.ahpRelay?.chat()), [...chatsBefore, retryChat, edited], { timeout: PATIENCE });
  await idleWith(b, 1);
  check((await turns(b))[0].message.text === before[0].message.text, "a fork holds the turns through the one forked");
  await b.screenshot({ path: join(outDir, "messages-phone.png") });
  // The other way round: the phone edits (its Send button: Return is a new line there), the desktop retries and
  // forks; each branches, and the chat it came from keeps its turns.
  const currentChat = (page) => page.evaluate(() => globalThis.ahpRelay?.chat());
  const branchedFrom = async (page, start) => {
    const known = await chatsOf(page);
    await start();
    await page.waitForFunction((k) => !k.includes(globalThis.ahpRelay?.chat()), known, { timeout: PATIENCE });
    await idleWith(page, 1);
    return (await turns(page))[0];
  };
  await b.click(`#chats .tab[data-chat="${chat}"]`);
  await idleWith(b, 2);
  const phoneEdit = await branchedFrom(b, async () => {
    await b.locator("#transcript .turn").first().locator(".edit-prompt").click();
    await b.fill("#transcript .edit-box", "edited on the phone");
    await b.click("#transcript .send-edit");
  });
  check(phoneEdit.message.text === "edited on the phone", `the phone's edit runs on a branch (${phoneEdit.message.text})`);
  await a.click(`#chats .tab[data-chat="${edited}"]`);
  await idleWith(a, 1);
  const desktopRetry = await branchedFrom(a, () => a.locator("#transcript .turn").last().locator(".retry-turn").click());
  check(desktopRetry.message.text === "show markdown again" && (await currentChat(a)) !== edited, "the desktop's retry runs on a branch");
  await a.click(`#chats .tab[data-chat="${chat}"]`);
  await idleWith(a, 2);
  check(isDeepStrictEqual((await turns(a)).map((t) => t.id), before.map((t) => t.id)), "the chat the phone edited keeps every turn");
  const desktopFork = await branchedFrom(a, () => a.locator("#transcript .turn").first().locator(".fork-turn").click());
  check(desktopFork.message.text === before[0].message.text && desktopFork.state === "complete", "the desktop's fork holds the turn forked");
  check(problems.length === 0, `no page errors:\n${problems.join("\n")}`);
  console.log(JSON.stringify({ session, accessibility }));
}

/**
 * Search: the relay holds 40 titled sessions (the test made them); the list shows the first page, a search by
 * title finds matches beyond it (the relay searches), on a desktop and a phone; find in a chat marks and counts
 * what it finds in the loaded turns and steps through it.
 */
async function search(token, outDir) {
  mkdirSync(outDir, { recursive: true });
  const link = `${base}/#token=${encodeURIComponent(token)}`;
  const titles = (page) => page.evaluate(() => [...document.querySelectorAll("#sessions li .title")].map((t) => t.textContent));
  const listed = (page, count) =>
    page.waitForFunction((n) => document.querySelectorAll("#sessions li[data-uri]").length === n, count, { timeout: PATIENCE });
  const desktop = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const a = await watchedPage(desktop, "desktop", problems);
  await a.goto(link);
  await online(a);
  await listed(a, 30);
  check(!(await titles(a)).includes("Launch plan 3"), "the oldest match is beyond the first page");
  await a.fill("#session-search", "launch");
  await listed(a, 4);
  let found = await titles(a);
  check(JSON.stringify(found) === JSON.stringify(["Launch plan 33", "Launch plan 23", "Launch plan 13", "Launch plan 3"]), `the search finds every match, newest first (${found})`);
  await a.fill("#session-search", "no such title");
  await listed(a, 0);
  check(await a.isVisible("#empty-sessions"), "no match says so");
  // Issue 36 (12): what was said is searched too, by the relay (the session's title does not hold it).
  await a.fill("#session-search", "ZANZIBAR");
  await listed(a, 1);
  found = await titles(a);
  check(JSON.stringify(found) === JSON.stringify(["Other work 7"]), `a word said in a turn finds its session (${found})`);
  await a.fill("#session-search", "");
  await listed(a, 30);

  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  const b = await watchedPage(phone, "phone", problems);
  await b.goto(link);
  await online(b);
  await listed(b, 30);
  await b.fill("#session-search", "PLAN 3");
  await listed(b, 2);
  found = await titles(b);
  check(JSON.stringify(found) === JSON.stringify(["Launch plan 33", "Launch plan 3"]), `the phone's search ignores case (${found})`);
  await b.fill("#session-search", "zanzibar");
  await listed(b, 1);
  const saidOnPhone = await titles(b);
  check(JSON.stringify(saidOnPhone) === JSON.stringify(["Other work 7"]), `the phone finds a word said in a turn too (${saidOnPhone})`);
  await b.fill("#session-search", "PLAN 3");
  await listed(b, 2);
  await b.screenshot({ path: join(outDir, "search-phone.png") });
  await accessible(b, "phone: search results");

  // Find in a chat: the desktop opens the newest match and talks to the demo agent.
  await a.fill("#session-search", "launch plan 33");
  await listed(a, 1);
  await a.click("#sessions li a");
  await a.waitForSelector("#session-view:not([hidden])", { timeout: PATIENCE });
  for (const [i, prompt] of ["alpha one", "beta two", "alpha three"].entries()) {
    await a.fill("#prompt", prompt);
    await a.click("#composer-send");
    await a.waitForFunction(
      (n) => {
        const chat = globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat());
        return chat && !chat.activeTurn && (chat.turns ?? []).length === n;
      },
      i + 1,
      { timeout: PATIENCE },
    );
  }
  const marked = (page, name) => page.evaluate((n) => CSS.highlights.get(n)?.size ?? 0, name);
  await a.fill("#find-in-chat", "ALPHA");
  await a.waitForFunction(() => document.getElementById("find-count").textContent === "4 matches", null, { timeout: PATIENCE });
  check((await marked(a, "find")) === 4, "each prompt and its echo are marked (4)");
  await a.press("#find-in-chat", "Enter");
  check((await a.textContent("#find-count")) === "1 of 4" && (await marked(a, "find-current")) === 1, "Enter steps to the first");
  await a.press("#find-in-chat", "Enter");
  check((await a.textContent("#find-count")) === "2 of 4", "and on");
  await a.screenshot({ path: join(outDir, "find-desktop.png") });
  await accessible(a, "desktop: find in chat");
  await a.fill("#find-in-chat", "zzz");
  await a.waitForFunction(() => document.getElementById("find-count").textContent === "no match", null, { timeout: PATIENCE });
  check((await marked(a, "find")) === 0, "nothing is marked for no match");
  // The phone opens the session and finds there too.
  await b.click("#sessions li[data-uri] a >> nth=0");
  await b.waitForFunction(() => (globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat())?.turns ?? []).length === 3, null, { timeout: PATIENCE });
  await b.fill("#find-in-chat", "beta");
  await b.waitForFunction(() => document.getElementById("find-count").textContent === "2 matches", null, { timeout: PATIENCE });
  check(problems.length === 0, `no page errors:\n${problems.join("\n")}`);
  console.log(JSON.stringify({ found, accessibility }));
}

async function reduce(inputPath, outputPath) {
  const input = JSON.parse(readFileSync(inputPath, "utf8"));
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(`${base}/`);
  const states = await page.evaluate(async ({ snapshots, envelopes, uris }) => {
    const reducers = await import("/assets/reducers.js");
    await reducers.default({ module_or_path: "/assets/reducers_bg.wasm" });
    const mirror = new reducers.Mirror();
    for (const snapshot of snapshots) mirror.applySnapshot(JSON.stringify(snapshot));
    for (const envelope of envelopes) mirror.applyEnvelope(JSON.stringify(envelope));
    return Object.fromEntries(uris.map((uri) => [uri, JSON.parse(mirror.state(uri) ?? "null")]));
  }, input);
  writeFileSync(outputPath, JSON.stringify(states));
}

/**
 * The session's workspace: a turn's changes (files, counts, a diff) with review marks shared by devices and a
 * revert after its confirmation; a terminal the desktop opens and types into, which the phone watches.
 */
async function workspace(token, session, outDir) {
  mkdirSync(outDir, { recursive: true });
  const link = `${base}/#token=${encodeURIComponent(token)}`;
  const openSession = async (page) => {
    await page.goto(link);
    await online(page);
    await page.click(`#sessions li[data-uri="${session}"] a`);
    await page.waitForSelector("#changes-toggle:not([hidden])", { timeout: PATIENCE });
  };
  const rows = (page) => page.evaluate(() => [...document.querySelectorAll("#changes-list li.change")].map((li) => li.dataset.file));
  const desktop = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const a = await watchedPage(desktop, "desktop", problems);
  await openSession(a);
  await a.click("#changes-toggle");
  await a.waitForSelector('#changes-list li[data-file="c.txt"]', { timeout: PATIENCE });
  check(JSON.stringify(await rows(a)) === JSON.stringify(["a.txt", "b.txt", "c.txt"]), `the turn's three files (${await rows(a)})`);
  check(await a.isHidden("#composer"), "the changes take the conversation's place");
  const stats = await a.textContent('#changes-list li[data-file="a.txt"] .change-stats');
  check(stats.includes("+1") && stats.includes("−0"), `a.txt's counts (${stats})`);
  await a.click('#changes-list li[data-file="a.txt"] .change-name');
  await a.waitForSelector("#change-diff pre.diff .diff-add", { timeout: PATIENCE });
  const diff = await a.evaluate(() => [...document.querySelectorAll("#change-diff pre.diff div")].map((d) => [d.className, d.textContent]));
  check(diff.some(([c, t]) => c === "diff-add" && t === "+ three"), `the added line (${JSON.stringify(diff)})`);
  check(diff.some(([c, t]) => c === "diff-same" && t === "  one"), `an unchanged line (${JSON.stringify(diff)})`);
  await accessible(a, "desktop: a turn's changes with a diff");
  await a.screenshot({ path: join(outDir, "changes-desktop.png") });

  // A phone opens the same changes; the desktop's review mark shows there.
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  const b = await watchedPage(phone, "phone", problems);
  await openSession(b);
  await b.click("#changes-toggle");
  await b.waitForSelector('#changes-list li[data-file="c.txt"]', { timeout: PATIENCE });
  await a.check('#changes-list li[data-file="a.txt"] .change-reviewed');
  await b.waitForFunction(() => document.querySelector('#changes-list li[data-file="a.txt"] .change-reviewed')?.checked === true, null, {
    timeout: PATIENCE,
  });
  // Issue 36 (12): reverting a file the turn created says that it deletes it (and the user may keep it).
  await b.click('#changes-list li[data-file="c.txt"] .change-revert');
  await b.waitForSelector("#confirm-change[open]", { timeout: PATIENCE });
  const deleting = { text: await b.textContent("#confirm-change-text"), button: await b.textContent("#confirm-change-ok") };
  check(deleting.text.includes("c.txt") && deleting.text.includes("deletes it") && deleting.button === "Delete the file", `reverting a new file says it deletes it (${JSON.stringify(deleting)})`);
  await b.click("#confirm-change-cancel");
  // The desktop says so too.
  await a.click('#changes-list li[data-file="c.txt"] .change-revert');
  await a.waitForSelector("#confirm-change[open]", { timeout: PATIENCE });
  const deletingOnDesktop = { text: await a.textContent("#confirm-change-text"), button: await a.textContent("#confirm-change-ok") };
  check(deletingOnDesktop.text.includes("deletes it") && deletingOnDesktop.button === "Delete the file", `the desktop's revert of a new file says it deletes it (${JSON.stringify(deletingOnDesktop)})`);
  await a.click("#confirm-change-cancel");
  // The phone reverts b.txt, after the warning; both devices see it leave.
  await b.click('#changes-list li[data-file="b.txt"] .change-revert');
  await b.waitForSelector("#confirm-change[open]", { timeout: PATIENCE });
  const warning = await b.textContent("#confirm-change-text");
  check(warning.includes("b.txt") && warning.includes("lost"), `the revert says what it does (${warning})`);
  await b.click("#confirm-change-ok");
  for (const page of [a, b]) {
    await page.waitForFunction(
      () => !document.querySelector('#changes-list li[data-file="b.txt"]') && !!document.querySelector('#changes-list li[data-file="a.txt"]'),
      null,
      { timeout: PATIENCE },
    );
  }
  check(
    await b.evaluate(() => document.querySelector('#changes-list li[data-file="a.txt"] .change-reviewed').checked),
    "the review mark stays on a.txt",
  );
  await accessible(b, "phone: a turn's changes");
  await b.screenshot({ path: join(outDir, "changes-phone.png") });

  // A terminal: the desktop opens one and types; the phone watches it.
  const shown = (page) => page.evaluate(() => globalThis.ahpRelay?.terminalText() ?? "");
  await a.click("#terminal-toggle");
  await a.click("#terminal-new");
  await a.waitForSelector("#terminal-screen .xterm", { timeout: PATIENCE });
  await a.click("#terminal-screen .xterm");
  await a.keyboard.type("echo hi-$((6*7))\n");
  await a.waitForFunction(() => /^hi-42\s*$/m.test(globalThis.ahpRelay?.terminalText() ?? ""), null, { timeout: PATIENCE });
  await accessible(a, "desktop: a terminal");
  await a.screenshot({ path: join(outDir, "terminal-desktop.png") });
  await b.click("#terminal-toggle");
  await b.waitForSelector("#terminal-list button", { timeout: PATIENCE });
  await b.click("#terminal-list button");
  await b.waitForFunction(() => /^hi-42\s*$/m.test(globalThis.ahpRelay?.terminalText() ?? ""), null, { timeout: PATIENCE });
  await a.keyboard.type("echo second-$((1+1))\n");
  await b.waitForFunction(() => /^second-2\s*$/m.test(globalThis.ahpRelay?.terminalText() ?? ""), null, { timeout: PATIENCE });
  await accessible(b, "phone: watching a terminal");
  await b.screenshot({ path: join(outDir, "terminal-phone.png") });
  check(problems.length === 0, `no page errors:\n${problems.join("\n")}`);
  console.log(JSON.stringify({ workspace: "ok", terminal: (await shown(b)).includes("second-2"), accessibility }));
}

/**
 * A newcomer's relay (`serve` with no flags): the demo session's turn shows in the Changes pane as the file
 * it wrote, `notes.md`, with its added line.
 */
async function demoChanges(token, session, outDir) {
  mkdirSync(outDir, { recursive: true });
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await watchedPage(context, "desktop", problems);
  await page.goto(`${base}/#token=${encodeURIComponent(token)}`);
  await online(page);
  await page.click(`#sessions li[data-uri="${session}"] a`);
  await page.waitForSelector("#changes-toggle:not([hidden])", { timeout: PATIENCE });
  await page.click("#changes-toggle");
  await page.waitForSelector('#changes-list li[data-file="notes.md"]', { timeout: PATIENCE });
  const stats = await page.textContent('#changes-list li[data-file="notes.md"] .change-stats');
  check(stats.includes("+1"), `notes.md's added line (${stats})`);
  await page.screenshot({ path: join(outDir, "demo-changes.png") });
  check(problems.length === 0, `no page errors:\n${problems.join("\n")}`);
  console.log(JSON.stringify({ demo: "ok" }));
}

/**
 * Issue 36: a team in one tenant — Alice (a member, at a keyboard, then on a phone too), Bob (a member), Vic (a
 * viewer) — and Mallory of another tenant, whose link must not sign Alice's tab in. Checks, on desktop and
 * phone: per-chat drafts, names on messages, edit only of one's own prompt, a keyboard-only run (no mouse
 * event) with at most 5 Tabs from opening a session to its message box, what a screen reader hears, approvals
 * disabled offline, Return on a phone, a session's own terminals, panes only where they work, view only.
 */
async function team(alice, bob, viewer, mallory, outDir) {
  mkdirSync(outDir, { recursive: true });
  const linkFor = (token) => `${base}/#token=${encodeURIComponent(token)}`;
  const chatOf = (page) => page.evaluate(() => globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat()));
  const idleWith = (page, count) =>
    page.waitForFunction(
      (n) => {
        const chat = globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat());
        return chat && !chat.activeTurn && (chat.turns ?? []).length === n;
      },
      count,
      { timeout: PATIENCE },
    );
  const focusedId = (page) => page.evaluate(() => document.activeElement?.id ?? "");
  const desktop = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  // What a screen reader hears (every text the page's live regions take), and every mouse event: none allowed
  // in the keyboard run.
  const hearAnnouncer = () => {
    globalThis.__heard = [];
    globalThis.__mouse = 0;
    for (const type of ["mousedown", "pointerdown", "mouseup"]) window.addEventListener(type, () => globalThis.__mouse++, true);
    document.addEventListener("DOMContentLoaded", () => {
      const announcer = document.getElementById("announcer");
      new MutationObserver(() => {
        if (announcer.textContent) globalThis.__heard.push(announcer.textContent);
      }).observe(announcer, { childList: true, characterData: true, subtree: true });
    });
  };
  await desktop.addInitScript(hearAnnouncer);
  // The page's structure for a keyboard and a screen reader, on either device.
  const structure = (page) =>
    page.evaluate(() => ({
      skip: document.querySelector("a.skip-link")?.getAttribute("href") ?? "",
      label: document.querySelector('label[for="prompt"]')?.textContent ?? "",
      live: !!document.getElementById("transcript").closest("[aria-live]") || !!document.querySelector("#transcript [aria-live]"),
      list: document.getElementById("transcript").tagName === "OL" && [...document.getElementById("transcript").children].every((n) => n.tagName === "LI"),
    }));
  const a = await watchedPage(desktop, "alice desktop", problems);

  // ── Keyboard only: create a session, send a multi-line message, approve the tool call, open a terminal.
  await a.goto(linkFor(alice));
  await online(a);
  const who = await a.innerText("#who");
  check(who.includes("alice") && who.includes("tenant dev"), `the header names the user and the tenant (${who})`);
  let tabs = 0;
  while ((await focusedId(a)) !== "new-session-agent" && tabs < 15) {
    await a.keyboard.press("Tab");
    tabs++;
  }
  check((await focusedId(a)) === "new-session-agent", "the new-session form is reached with Tab");
  for (let i = 0; i < 5 && (await a.evaluate(() => document.getElementById("new-session-agent").value)) !== "scripted"; i++) {
    await a.keyboard.press("ArrowDown");
  }
  check((await a.evaluate(() => document.getElementById("new-session-agent").value)) === "scripted", "the agent is chosen with the keyboard");
  await a.keyboard.press("Tab"); // the model
  await a.keyboard.press("Tab"); // the working directory
  check((await focusedId(a)) === "new-session-dir", `Tab reaches the directory field (${await focusedId(a)})`);
  await a.keyboard.type("teamproj");
  await a.keyboard.press("Enter");
  await a.waitForSelector("#session-view:not([hidden])", { timeout: PATIENCE });
  await a.waitForFunction(() => document.activeElement?.id === "prompt" || !!globalThis.ahpRelay?.chat(), null, { timeout: PATIENCE });
  let toBox = 0;
  while ((await focusedId(a)) !== "prompt" && toBox <= 5) {
    await a.keyboard.press("Tab");
    toBox++;
  }
  check(toBox <= 5 && (await focusedId(a)) === "prompt", `at most 5 Tabs from opening a session to its message box (${toBox})`);
  const s1 = await a.evaluate(() => globalThis.ahpRelay?.session());
  const c1 = await a.evaluate(() => globalThis.ahpRelay?.chat());
  check(await a.evaluate(() => !document.getElementById("transcript").closest("[aria-live]") && !document.querySelector("#transcript [aria-live]")), "the transcript is not a live region");
  check((await a.evaluate(() => document.querySelector('label[for="prompt"]')?.textContent)) === "Message to the agent", "the message box has a label of its own");
  const onDesktop = await structure(a);
  check(onDesktop.skip === "#prompt", `a skip link leads to the message box (${JSON.stringify(onDesktop)})`);
  // A multi-line message: Shift+Enter is a new line, Enter sends.
  await a.keyboard.type("please ask");
  await a.keyboard.press("Shift+Enter");
  await a.keyboard.type("for permission");
  await a.keyboard.press("Enter");
  await a.waitForSelector("#pending .confirmation button.approve", { timeout: PATIENCE });
  const sent = (await chatOf(a))?.activeTurn?.message?.text;
  check(sent === "please ask\nfor permission", `the message went with its two lines (${JSON.stringify(sent)})`);
  // The approval is reached from the message box with Shift+Tab.
  let back = 0;
  while (!(await a.evaluate(() => document.activeElement?.matches("#pending button.approve"))) && back < 10) {
    await a.keyboard.press("Shift+Tab");
    back++;
  }
  check(await a.evaluate(() => document.activeElement?.matches("#pending button.approve")), "the approval is reached with the keyboard");
  await a.keyboard.press("Enter");
  await idleWith(a, 1);
  check((await structure(a)).list, "the transcript is a list of turns");
  // The agent's command ran in a terminal; its card does not say "running" once the command is over.
  const terminalCard = await a.textContent("#transcript .tool.completed .tool-output.terminal");
  check(!terminalCard.includes("running"), `a finished command's terminal is not "running" (${terminalCard})`);
  // A screen reader heard that the agent needed input and that it finished, once each, and none of the reply.
  await a.waitForFunction(() => globalThis.__heard.includes("The agent finished."), null, { timeout: PATIENCE });
  const heard = await a.evaluate(() => globalThis.__heard);
  check(
    heard.filter((t) => t === "The agent finished.").length === 1 && heard.filter((t) => t === "The agent needs your input.").length === 1 && heard.length === 2,
    `the live region announced the input request and the finished turn once each, nothing else (${JSON.stringify(heard)})`,
  );
  // Opening a session from the list with Enter lands in its message box too (within 5 Tabs).
  await a.evaluate(() => document.activeElement?.blur());
  let toList = 0;
  while (!(await a.evaluate((s) => document.activeElement?.closest("#sessions li")?.dataset.uri === s, s1)) && toList < 40) {
    await a.keyboard.press("Tab");
    toList++;
  }
  check(await a.evaluate((s) => document.activeElement?.closest("#sessions li")?.dataset.uri === s, s1), "the session list is reached with Tab");
  await a.keyboard.press("Enter");
  let fromList = 0;
  await a.waitForFunction(() => document.activeElement?.id === "prompt" || document.activeElement === document.body, null, { timeout: PATIENCE });
  while ((await focusedId(a)) !== "prompt" && fromList <= 5) {
    await a.keyboard.press("Tab");
    fromList++;
  }
  check(fromList <= 5 && (await focusedId(a)) === "prompt", `at most 5 Tabs from opening a session with Enter to its message box (${fromList})`);
  // The skip link, followed with the keyboard, lands in the message box.
  await a.focus("a.skip-link");
  await a.keyboard.press("Enter");
  check((await focusedId(a)) === "prompt", `the skip link leads to the message box (${await focusedId(a)})`);
  check(await a.evaluate((s) => new URLSearchParams(location.hash.slice(1)).get("s") === s, s1), "and the address still names the session");
  // The terminal: Shift+Tab up to the pane's button, Enter, then Tab to a new terminal.
  back = 0;
  while ((await focusedId(a)) !== "terminal-toggle" && back < 80) {
    await a.keyboard.press("Shift+Tab");
    back++;
  }
  check((await focusedId(a)) === "terminal-toggle", "the Terminal pane is reached with the keyboard");
  await a.keyboard.press("Enter");
  await a.waitForSelector("#terminal-pane:not([hidden])", { timeout: PATIENCE });
  let forward = 0;
  while ((await focusedId(a)) !== "terminal-new" && forward < 20) {
    await a.keyboard.press("Tab");
    forward++;
  }
  check((await focusedId(a)) === "terminal-new", "the new-terminal button is reached with Tab");
  await a.keyboard.press("Enter");
  await a.waitForFunction(() => document.activeElement?.closest("#terminal-screen"), null, { timeout: PATIENCE });
  await a.keyboard.type("echo kb-$((6*7))");
  await a.keyboard.press("Enter");
  await a.waitForFunction(() => /^kb-42\s*$/m.test(globalThis.ahpRelay?.terminalText() ?? ""), null, { timeout: PATIENCE });
  check((await a.evaluate(() => globalThis.__mouse)) === 0, "the keyboard run used no mouse");
  const label = await a.textContent("#terminal-list .tab.active");
  check(label.includes("teamproj"), `the terminal says where it runs (${label})`);
  await accessible(a, "team: keyboard run, terminal open", { serious: true });
  await a.click("#terminal-toggle"); // back to the chat (the keyboard run is over)

  // ── Bob joins: names on messages; only the author edits a prompt.
  const bobDesk = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const b = await watchedPage(bobDesk, "bob desktop", problems);
  await b.goto(`${linkFor(bob)}&s=${encodeURIComponent(s1)}`);
  await online(b);
  await idleWith(b, 1);
  check((await b.textContent("#transcript .turn .author")) === "alice", `Bob sees who wrote the prompt (${await b.textContent("#transcript .turn .author")})`);
  check((await a.textContent("#transcript .turn .author")) === "alice (you)", "Alice sees it is hers");
  check((await b.locator("#transcript .turn .edit-prompt").count()) === 0, "Bob may not edit Alice's prompt");
  check((await a.locator("#transcript .turn .edit-prompt").count()) === 1, "Alice may edit her own");

  // ── Drafts: what Alice types stays with its chat, across sessions, reloads and (she asks for it) her phone;
  // not in Bob's box.
  check(!(await a.isChecked("#share-drafts")), "drafts stay on the device unless the user shares them");
  await a.check("#share-drafts");
  await a.fill("#prompt", "draft for the plan");
  await a.selectOption("#new-session-agent", "demo");
  await a.fill("#new-session-dir", "");
  await a.click("#create-session");
  await a.waitForFunction((first) => globalThis.ahpRelay?.session() && globalThis.ahpRelay?.session() !== first && !!globalThis.ahpRelay?.chat(), s1, { timeout: PATIENCE });
  const s2 = await a.evaluate(() => globalThis.ahpRelay?.session());
  check((await a.inputValue("#prompt")) === "", "another session's box does not hold the draft");
  await a.click(`#sessions li[data-uri="${s1}"] a`);
  await a.waitForFunction((c) => globalThis.ahpRelay?.chat() === c, c1, { timeout: PATIENCE });
  await a.waitForFunction(() => document.getElementById("prompt").value === "draft for the plan", null, { timeout: PATIENCE });
  // Many renders later (two sessions opened, a chat reopened), still nothing more was said.
  const heardLater = await a.evaluate(() => globalThis.__heard);
  check(JSON.stringify(heardLater) === JSON.stringify(heard), `nothing more was announced since (${JSON.stringify(heardLater)})`);
  await a.reload();
  await online(a);
  await a.waitForFunction(() => document.getElementById("prompt").value === "draft for the plan", null, { timeout: PATIENCE });
  check((await b.inputValue("#prompt")) === "", "Alice's draft is not put in Bob's box");
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  await phone.addInitScript(hearAnnouncer);
  const p = await watchedPage(phone, "alice phone", problems);
  await p.goto(`${linkFor(alice)}&s=${encodeURIComponent(s1)}`);
  await online(p);
  await p.waitForFunction((c) => globalThis.ahpRelay?.chat() === c, c1, { timeout: PATIENCE });
  check((await p.inputValue("#prompt")) === "", "a device that does not share drafts does not take one");
  await p.check("#share-drafts");
  await p.waitForFunction(() => document.getElementById("prompt").value === "draft for the plan", null, { timeout: PATIENCE });
  check(await p.isVisible("#who"), "the phone shows who is signed in");
  check((await p.getAttribute("#who", "title")).includes("tenant dev"), "and in which tenant");
  const whoOnPhone = await p.evaluate(() => {
    const who = document.getElementById("who").getBoundingClientRect();
    const tenant = document.querySelector("#who .who-tenant").getBoundingClientRect();
    return { text: document.getElementById("who").innerText.replace(/\s+/g, " "), shown: tenant.width > 0 && tenant.right <= who.right + 0.5 };
  });
  check(whoOnPhone.text === "alice · dev" && whoOnPhone.shown, `the phone's header shows the user and the tenant, unclipped (${JSON.stringify(whoOnPhone)})`);
  // A long user id (an identity provider's) gives way; the tenant stays whole.
  const longName = await p.evaluate(() => {
    const user = document.querySelector("#who .who-user");
    const before = user.textContent;
    user.textContent = "google-oauth2|109876543210987654321";
    const who = document.getElementById("who").getBoundingClientRect();
    const tenant = document.querySelector("#who .who-tenant");
    const box = tenant.getBoundingClientRect();
    const shown = box.width > 0 && box.right <= who.right + 0.5 && tenant.scrollWidth <= tenant.clientWidth;
    user.textContent = before;
    return shown;
  });
  check(longName, "with a long user id the phone still shows the whole tenant");
  // On the phone too, the draft stays with its chat: not in another session's box, back after a reload.
  await p.click("#back");
  await p.waitForFunction(() => document.body.dataset.view === "sessions", null, { timeout: PATIENCE });
  await p.click(`#sessions li[data-uri="${s2}"] a`);
  await p.waitForFunction((s) => globalThis.ahpRelay?.session() === s && !!globalThis.ahpRelay?.chat(), s2, { timeout: PATIENCE });
  check((await p.inputValue("#prompt")) === "", "the phone's other session's box does not hold the draft");
  await p.click("#back");
  await p.waitForFunction(() => document.body.dataset.view === "sessions", null, { timeout: PATIENCE });
  await p.click(`#sessions li[data-uri="${s1}"] a`);
  await p.waitForFunction((c) => globalThis.ahpRelay?.chat() === c, c1, { timeout: PATIENCE });
  await p.waitForFunction(() => document.getElementById("prompt").value === "draft for the plan", null, { timeout: PATIENCE });
  await p.reload();
  await online(p);
  await p.waitForFunction(() => document.getElementById("prompt").value === "draft for the plan", null, { timeout: PATIENCE });
  const onPhone0 = await structure(p);
  check(onPhone0.skip === "#prompt" && onPhone0.label === "Message to the agent" && !onPhone0.live && onPhone0.list, `the phone's page has the skip link, the label, a transcript list and no live transcript (${JSON.stringify(onPhone0)})`);
  await p.focus("a.skip-link");
  await p.keyboard.press("Enter");
  check(await p.evaluate(() => document.activeElement?.id === "prompt"), "followed on the phone, the skip link lands in the message box");
  check((await p.locator("#transcript .turn .edit-prompt").count()) === 1, "the phone offers Alice the edit of her prompt");
  const phoneCard = await p.textContent("#transcript .tool.completed .tool-output.terminal");
  check(!phoneCard.includes("running"), `the phone's terminal card is not "running" after the command (${phoneCard})`);

  // ── Bob writes (sharing his draft, which takes the chat's one draft slot): Alice sees his name on it, his
  // sending clears his draft and leaves hers, and Bob may edit his own.
  await b.check("#share-drafts");
  await b.fill("#prompt", "hello from bob");
  await a.waitForFunction(() => globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat())?.draft?._meta?.["ahpRelay/author"]?.sub === "bob", null, { timeout: PATIENCE });
  await a.evaluate(() => document.activeElement?.blur());
  await b.click("#composer-send");
  await a.waitForFunction(() => !globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat())?.draft, null, { timeout: PATIENCE });
  await idleWith(a, 2);
  await idleWith(b, 2);
  const authors = await a.evaluate(() => [...document.querySelectorAll("#transcript .turn .author")].map((n) => n.textContent));
  check(authors.join(",") === "alice (you),bob", `every message names its author (${authors})`);
  await idleWith(p, 2);
  const onPhone = await p.evaluate(() => [...document.querySelectorAll("#transcript .turn .author")].map((n) => n.textContent));
  check(onPhone.join(",") === "alice (you),bob", `the phone names them too (${onPhone})`);
  check((await p.locator("#transcript .turn").nth(1).locator(".edit-prompt").count()) === 0, "Alice's phone may not edit Bob's prompt");
  await p.waitForFunction(() => globalThis.__heard.includes("The agent finished."), null, { timeout: PATIENCE });
  const heardOnPhone = await p.evaluate(() => globalThis.__heard);
  check(heardOnPhone.length === 1 && heardOnPhone[0] === "The agent finished.", `the phone's live region announced Bob's finished turn once, nothing of its pieces (${JSON.stringify(heardOnPhone)})`);
  check((await b.locator("#transcript .turn").nth(1).locator(".edit-prompt").count()) === 1, "Bob may edit his own prompt");
  check((await a.inputValue("#prompt")) === "draft for the plan", "Bob's message leaves Alice's draft alone");
  // Alice names the session; an agent's naming does not replace it later (the scripted agent names a session
  // after each of its chats' first prompts — the branch below is one).
  await a.click("#rename-session-start");
  await a.fill("#rename-session-title", "Team plan");
  await a.press("#rename-session-title", "Enter");
  await b.waitForFunction(() => document.getElementById("session-title").textContent === "Team plan", null, { timeout: PATIENCE });
  // Alice edits her first prompt: it runs on a new branch, and Bob's turn after it stays, on every device.
  await a.locator("#transcript .turn").first().locator(".edit-prompt").click();
  await a.fill("#transcript .edit-box", "please ask again");
  await a.press("#transcript .edit-box", "Enter");
  await a.waitForFunction((first) => globalThis.ahpRelay?.chat() !== first, c1, { timeout: PATIENCE });
  await idleWith(a, 1);
  check((await chatOf(a)).turns[0].message.text === "please ask again", "the edit runs on its branch");
  check((await a.textContent("#session-title")) === "Team plan", `the branch's first prompt left Alice's title (${await a.textContent("#session-title")})`);
  await a.screenshot({ path: join(outDir, "team-branch.png") });
  check(((await chatOf(b))?.turns ?? []).length === 2 && (await b.evaluate(() => globalThis.ahpRelay?.chat())) === c1, "Bob's chat keeps both turns");
  await a.click(`#chats .tab[data-chat="${c1}"]`);
  await a.waitForFunction((c) => globalThis.ahpRelay?.chat() === c, c1, { timeout: PATIENCE });
  await idleWith(a, 2);
  await a.waitForFunction(() => document.getElementById("prompt").value === "draft for the plan", null, { timeout: PATIENCE });
  await a.screenshot({ path: join(outDir, "team-desktop.png") });

  // ── Phone: Return is a new line, not a send.
  await p.click("#prompt");
  await p.keyboard.press("End");
  await p.keyboard.press("Enter");
  await p.keyboard.type("second line");
  check((await p.inputValue("#prompt")) === "draft for the plan\nsecond line", `Return made a new line on the phone (${JSON.stringify(await p.inputValue("#prompt"))})`);
  check(((await chatOf(p))?.turns ?? []).length === 2 && !(await chatOf(p))?.activeTurn, "and sent nothing");
  await p.screenshot({ path: join(outDir, "team-phone.png") });
  const heardOnPhoneLater = await p.evaluate(() => globalThis.__heard);
  check(heardOnPhoneLater.length === 1, `the phone announced nothing more since (${JSON.stringify(heardOnPhoneLater)})`);
  // (Read from a fresh snapshot: the branch's turn is over, so whatever the agent said is in it.)
  await p.reload();
  await online(p);
  await p.waitForFunction(() => !!globalThis.ahpRelay?.state(globalThis.ahpRelay?.session())?.title, null, { timeout: PATIENCE });
  const titleOnPhone = await p.evaluate(() => globalThis.ahpRelay?.state(globalThis.ahpRelay?.session())?.title);
  check(titleOnPhone === "Team plan", `the phone keeps Alice's title too (${titleOnPhone})`);
  await accessible(p, "team: phone, a shared chat with names", { serious: true });

  // ── The demo has no workspace: no Files or Terminal pane, and a !command says it runs nothing there.
  await a.click(`#sessions li[data-uri="${s2}"] a`);
  await a.waitForFunction((s) => globalThis.ahpRelay?.session() === s && !!globalThis.ahpRelay?.chat(), s2, { timeout: PATIENCE });
  // An empty box that merely has focus (opening a session puts it there) takes the draft Alice types on her
  // phone, and its clearing.
  await a.waitForFunction(() => document.activeElement?.id === "prompt", null, { timeout: PATIENCE });
  await p.goto(`${base}/#s=${encodeURIComponent(s2)}`);
  await p.reload();
  await online(p);
  await p.waitForFunction((s) => globalThis.ahpRelay?.session() === s && !!globalThis.ahpRelay?.chat(), s2, { timeout: PATIENCE });
  await p.fill("#prompt", "from the phone");
  await a.waitForFunction(() => document.getElementById("prompt").value === "from the phone", null, { timeout: PATIENCE });
  check(await a.evaluate(() => document.activeElement?.id === "prompt"), "the desktop's box kept its focus");
  await p.fill("#prompt", "");
  await a.waitForFunction(() => document.getElementById("prompt").value === "", null, { timeout: PATIENCE });
  check((await a.isHidden("#files-toggle")) && (await a.isHidden("#terminal-toggle")), "a demo session offers no Files or Terminal");
  await a.fill("#prompt", "!ls");
  check(await a.isVisible("#command-hint"), "a !command in a demo session says it runs nothing");
  await a.fill("#prompt", "");

  // ── Offline: the approval waits, disabled, with the reason.
  await a.fill("#prompt", "Please use the tool then ask for input");
  await a.click("#composer-send");
  await p.goto(`${base}/#s=${encodeURIComponent(s2)}`);
  await p.reload();
  await online(p);
  await p.waitForSelector("#pending .confirmation button.approve", { timeout: PATIENCE });
  // The desktop offline: its Approve waits too.
  await a.waitForSelector("#pending .confirmation button.approve", { timeout: PATIENCE });
  await desktop.setOffline(true);
  await a.waitForFunction(() => document.getElementById("link-state").dataset.state !== "online", null, { timeout: PATIENCE });
  check((await a.isDisabled("#pending .confirmation button.approve")) && (await a.isDisabled("#pending .confirmation button.deny")) && (await a.isVisible("#pending-offline")), "offline, the desktop's Approve and Deny are disabled and it says why");
  await desktop.setOffline(false);
  await online(a);
  await phone.setOffline(true);
  await p.waitForFunction(() => document.getElementById("link-state").dataset.state !== "online", null, { timeout: PATIENCE });
  check(await p.isDisabled("#pending .confirmation button.approve"), "offline, Approve is disabled");
  check(await p.isDisabled("#pending .confirmation button.deny"), "offline, Deny is disabled");
  check(await p.isVisible("#pending-offline"), "and the page says why");
  await p.screenshot({ path: join(outDir, "team-phone-offline.png") });
  await phone.setOffline(false);
  await online(p);
  check(await p.isEnabled("#pending .confirmation button.approve"), "back online, Approve works again");
  await p.click("#pending .confirmation button.approve");
  // Bob answers the agent's question; everyone sees who approved and who answered.
  await b.goto(`${base}/#s=${encodeURIComponent(s2)}`);
  await b.reload();
  await online(b);
  await b.waitForSelector("#pending .input-form", { timeout: PATIENCE });
  await b.fill('#pending .input-form input[name="name"]', "Bob");
  await b.click("#pending .input-form button.approve");
  await a.waitForSelector('#transcript .turn-end[data-state="complete"]', { timeout: PATIENCE });
  const answeredBy = await a.textContent("#transcript .input-request .answered-by");
  check(answeredBy === "answered by bob", `the question says who answered (${answeredBy})`);
  const decidedBy = await b.textContent("#transcript .tool .decided-by");
  check(decidedBy.includes("alice"), `the tool call says who approved (${decidedBy})`);
  // A !command in the demo's session is a message like any other: one answer, no command, no error.
  await a.fill("#prompt", "!ls");
  await a.click("#composer-send");
  await idleWith(a, 2);
  const bang = await a.locator("#transcript .turn").nth(1).innerText();
  check(!/killed|running|error/i.test(bang) && (await a.locator("#transcript .turn").nth(1).locator(".turn-end").getAttribute("data-state")) === "complete", `the demo answers !ls as a message (${bang})`);

  // ── A session's own terminals: another session's folder lists none of teamproj's.
  await a.selectOption("#new-session-agent", "scripted");
  await a.fill("#new-session-dir", "otherproj");
  await a.click("#create-session");
  await a.waitForFunction((known) => globalThis.ahpRelay?.session() && !known.includes(globalThis.ahpRelay?.session()), [s1, s2], { timeout: PATIENCE });
  await a.waitForSelector("#terminal-toggle:not([hidden])", { timeout: PATIENCE });
  await a.click("#terminal-toggle");
  await a.waitForSelector("#terminal-pane:not([hidden])", { timeout: PATIENCE });
  // Every device terminal of the tenant has been read (placed) before the list is judged.
  await a.waitForFunction(() => document.getElementById("terminal-empty").hidden === false, null, { timeout: PATIENCE });
  check((await a.locator("#terminal-list button").count()) === 0, "teamproj's terminal is not listed in otherproj's session");
  await a.click("#terminal-toggle");
  // Nor in another session working in teamproj itself: a session lists the terminals opened in it.
  await a.selectOption("#new-session-agent", "scripted");
  await a.fill("#new-session-dir", "teamproj");
  const before = await a.evaluate(() => globalThis.ahpRelay?.session());
  await a.click("#create-session");
  await a.waitForFunction((known) => globalThis.ahpRelay?.session() && !known.includes(globalThis.ahpRelay?.session()), [s1, s2, before], { timeout: PATIENCE });
  const sameFolder = await a.evaluate(() => globalThis.ahpRelay?.session());
  await a.waitForSelector("#terminal-toggle:not([hidden])", { timeout: PATIENCE });
  await a.click("#terminal-toggle");
  await a.waitForSelector("#terminal-pane:not([hidden])", { timeout: PATIENCE });
  await a.waitForFunction(() => document.getElementById("terminal-empty").hidden === false, null, { timeout: PATIENCE });
  check((await a.locator("#terminal-list button").count()) === 0, "a second session in teamproj lists none of the first session's terminals");
  await a.click("#terminal-toggle");
  // Back in teamproj's session, its terminal opens with the pane (no tap needed), on the phone too.
  await p.goto(`${base}/#s=${encodeURIComponent(s1)}`);
  await p.reload();
  await online(p);
  await p.waitForSelector("#terminal-toggle:not([hidden])", { timeout: PATIENCE });
  await p.click("#terminal-toggle");
  await p.waitForFunction(() => /kb-42/.test(globalThis.ahpRelay?.terminalText() ?? ""), null, { timeout: PATIENCE });
  const phoneLabel = await p.textContent("#terminal-list .tab.active");
  check(phoneLabel.includes("teamproj"), `the phone says where the terminal runs (${phoneLabel})`);
  await p.click("#terminal-toggle");
  // The same-folder session on the phone lists none of them either (the page, which knows where the terminal
  // runs, opens it from its list).
  await p.click("#back");
  await p.waitForFunction(() => document.body.dataset.view === "sessions", null, { timeout: PATIENCE });
  await p.click(`#sessions li[data-uri="${sameFolder}"] a`);
  await p.waitForFunction((s) => globalThis.ahpRelay?.session() === s, sameFolder, { timeout: PATIENCE });
  await p.waitForSelector("#terminal-toggle:not([hidden])", { timeout: PATIENCE });
  await p.click("#terminal-toggle");
  await p.waitForFunction(() => document.getElementById("terminal-empty").hidden === false, null, { timeout: PATIENCE });
  check((await p.locator("#terminal-list button").count()) === 0, "the phone lists no terminal of another session in the same folder");
  await p.click("#terminal-toggle");
  // Bob's desktop: the terminal opens with the pane, no click on it needed.
  await b.click(`#sessions li[data-uri="${s1}"] a`);
  await b.waitForFunction((s) => globalThis.ahpRelay?.session() === s, s1, { timeout: PATIENCE });
  await b.waitForSelector("#terminal-toggle:not([hidden])", { timeout: PATIENCE });
  await b.click("#terminal-toggle");
  await b.waitForFunction(() => /kb-42/.test(globalThis.ahpRelay?.terminalText() ?? ""), null, { timeout: PATIENCE });
  await b.click("#terminal-toggle");

  // ── A viewer: told it is view only, and listed under Connected.
  const watcher = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const v = await watchedPage(watcher, "viewer", problems);
  await v.goto(`${linkFor(viewer)}&s=${encodeURIComponent(s1)}`);
  await online(v);
  await v.waitForSelector("#view-only:not([hidden])", { timeout: PATIENCE });
  check(await v.isHidden("#composer"), "a viewer has no message box");
  await b.waitForFunction(() => [...document.querySelectorAll("#people .person")].some((n) => n.textContent.includes("vic (watching)")), null, { timeout: PATIENCE });
  // …and the phone, which opens the session now.
  await p.goto(`${base}/#s=${encodeURIComponent(s1)}`);
  await p.reload();
  await online(p);
  await p.waitForFunction(() => [...document.querySelectorAll("#people .person")].some((n) => n.textContent.includes("vic (watching)")), null, { timeout: PATIENCE });
  await accessible(v, "team: a viewer", { serious: true });
  const watcherPhone = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  const vp = await watchedPage(watcherPhone, "viewer phone", problems);
  await vp.goto(`${linkFor(viewer)}&s=${encodeURIComponent(s1)}`);
  await online(vp);
  await vp.waitForSelector("#view-only:not([hidden])", { timeout: PATIENCE });
  check(await vp.isHidden("#composer"), "a viewer's phone has no message box either, and says why");

  // ── Mallory's link: a tab signed in as Alice asks before switching; staying keeps Alice and not the link's place.
  await a.goto(`${linkFor(mallory)}&s=${encodeURIComponent("ahp-session:/mallorys")}`);
  await a.reload();
  await a.waitForSelector("#confirm-switch[open]", { timeout: PATIENCE });
  const asked = await a.textContent("#confirm-switch");
  check(asked.includes("mallory") && asked.includes("tenant evil") && asked.includes("alice"), `the question names both accounts (${asked})`);
  await a.screenshot({ path: join(outDir, "team-link-question.png") });
  await a.click("#confirm-switch-stay");
  await online(a);
  check((await a.textContent("#who")).includes("tenant dev"), "staying keeps Alice's sign-in");
  check(!(await a.evaluate(() => location.hash.includes("mallorys"))), "and does not open the link's session");
  // A new tab of the same browser (no token of its own) asks too, because the browser knows Alice; switching
  // takes the link.
  const fresh = await watchedPage(desktop, "new tab", problems);
  await fresh.goto(linkFor(mallory));
  await fresh.waitForSelector("#confirm-switch[open]", { timeout: PATIENCE });
  await fresh.click("#confirm-switch-ok");
  await online(fresh);
  check((await fresh.textContent("#who")).includes("tenant evil"), "switching signs the tab in with the link");
  // On a phone too: Alice's phone asks before Mallory's link, and staying keeps her.
  await p.goto(`${linkFor(mallory)}&s=${encodeURIComponent("ahp-session:/mallorys")}`);
  await p.reload();
  await p.waitForSelector("#confirm-switch[open]", { timeout: PATIENCE });
  check((await p.textContent("#confirm-switch")).includes("tenant evil"), "the phone asks before switching");
  await p.click("#confirm-switch-stay");
  await online(p);
  check((await p.getAttribute("#who", "title")).includes("tenant dev"), "staying keeps Alice on the phone");

  // Files can be edited: Bob saves first; Alice, who began before him, is told and her text is kept.
  const editFile = async (page) => {
    await page.click(`#sessions li[data-uri="${s1}"] a`);
    await page.waitForFunction((s) => globalThis.ahpRelay?.session() === s, s1, { timeout: PATIENCE });
    await page.waitForSelector("#files-toggle:not([hidden])", { timeout: PATIENCE });
    await page.click("#files-toggle");
    await page.click('#files-list .file-entry[data-name="notes.txt"]');
    await page.click("#file-view .file-edit-start");
    await page.waitForSelector("#file-view textarea.file-editor", { timeout: PATIENCE });
  };
  await editFile(a);
  await a.fill("#file-view textarea.file-editor", "alice's version\n");
  await editFile(b);
  check((await b.inputValue("#file-view textarea.file-editor")) === "written by the test agent\n", "the editor holds the file's text");
  await b.fill("#file-view textarea.file-editor", "bob's version\n");
  await b.click("#file-view .file-save");
  await b.waitForSelector("#file-view .file-saved", { timeout: PATIENCE });
  await a.click("#file-view .file-save");
  await a.waitForFunction(() => document.querySelector("#file-view .file-edit-status")?.textContent.includes("changed since"), null, { timeout: PATIENCE });
  check((await a.inputValue("#file-view textarea.file-editor")) === "alice's version\n", "Alice's text is kept");
  await a.click("#files-toggle");
  await b.click("#files-toggle");
  // On the phone, the same file opens in the editor (and is left unchanged).
  await p.goto(`${base}/#s=${encodeURIComponent(s1)}`);
  await p.reload();
  await online(p);
  await p.waitForSelector("#files-toggle:not([hidden])", { timeout: PATIENCE });
  await p.click("#files-toggle");
  await p.click('#files-list .file-entry[data-name="notes.txt"]');
  await p.click("#file-view .file-edit-start");
  await p.waitForSelector("#file-view textarea.file-editor", { timeout: PATIENCE });
  check((await p.inputValue("#file-view textarea.file-editor")) === "bob's version\n", "the phone's editor holds the saved text");
  // Bob saves again meanwhile: the phone's save is refused, said so, and its text kept.
  await editFile(b);
  await b.fill("#file-view textarea.file-editor", "bob again\n");
  await b.click("#file-view .file-save");
  await b.waitForSelector("#file-view .file-saved", { timeout: PATIENCE });
  await b.click("#files-toggle");
  await p.fill("#file-view textarea.file-editor", "the phone's version\n");
  await p.click("#file-view .file-save");
  await p.waitForFunction(() => document.querySelector("#file-view .file-edit-status")?.textContent.includes("changed since"), null, { timeout: PATIENCE });
  check((await p.inputValue("#file-view textarea.file-editor")) === "the phone's version\n", "the phone's text is kept");
  // Opened again, the editor holds Bob's text; the phone's save then goes through.
  await p.click("#file-view .actions button.link");
  await p.click("#file-view .file-edit-start");
  await p.waitForFunction(() => document.querySelector("#file-view textarea.file-editor")?.value === "bob again\n", null, { timeout: PATIENCE });
  await p.fill("#file-view textarea.file-editor", "the phone's version\n");
  await p.click("#file-view .file-save");
  await p.waitForSelector("#file-view .file-saved", { timeout: PATIENCE });
  await p.click("#files-toggle");
  // What the phone saved is what another device now reads.
  await b.click("#files-toggle");
  await b.click('#files-list .file-entry[data-name="notes.txt"]');
  await b.waitForFunction(() => document.getElementById("file-view").textContent.includes("the phone's version"), null, { timeout: PATIENCE });
  await b.click("#files-toggle");

  // An agent that holds one chat: an edit replaces turns, so the page first says how many go, for everyone.
  const single = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  await single.addInitScript(hearAnnouncer);
  const d = await watchedPage(single, "single-chat agent", problems);
  await d.goto(linkFor(alice));
  await online(d);
  await d.selectOption("#new-session-agent", "single");
  await d.fill("#new-session-dir", "singleproj");
  await d.click("#create-session");
  await d.waitForSelector("#session-view:not([hidden])", { timeout: PATIENCE });
  await d.waitForFunction(() => !!globalThis.ahpRelay?.chat(), null, { timeout: PATIENCE });
  const singleSession = await d.evaluate(() => globalThis.ahpRelay?.session());
  for (const [n, text] of [[1, "first thing"], [2, "second thing"]]) {
    await d.fill("#prompt", text);
    await d.click("#composer-send");
    await idleWith(d, n);
  }
  await d.locator("#transcript .turn").first().locator(".edit-prompt").click();
  await d.fill("#transcript .edit-box", "first thing, edited");
  await d.press("#transcript .edit-box", "Enter");
  await d.waitForSelector("#confirm-truncate[open]", { timeout: PATIENCE });
  const truncating = await d.textContent("#confirm-truncate-text");
  check(truncating.includes("2 turns") && truncating.includes("everyone"), `the edit says how many turns go, for whom (${truncating})`);
  await d.click("#confirm-truncate-cancel");
  // Read from the relay afresh (a truncation sent anyway would be there).
  await d.reload();
  await online(d);
  await idleWith(d, 2);
  check(((await chatOf(d))?.turns ?? []).length === 2, "declined, nothing was removed");
  await d.locator("#transcript .turn").first().locator(".edit-prompt").click();
  await d.fill("#transcript .edit-box", "first thing, edited");
  await d.press("#transcript .edit-box", "Enter");
  await d.waitForSelector("#confirm-truncate[open]", { timeout: PATIENCE });
  await d.click("#confirm-truncate-ok");
  await d.waitForFunction(() => {
    const chat = globalThis.ahpRelay?.state(globalThis.ahpRelay?.chat());
    return chat && !chat.activeTurn && chat.turns.length === 1 && chat.turns[0].message.text === "first thing, edited";
  }, null, { timeout: PATIENCE });
  // A turn that ends in an error says so in words, never as JSON.
  await d.fill("#prompt", "please fail now");
  await d.click("#composer-send");
  await idleWith(d, 2);
  // Said to a screen reader once, however fast it ended.
  await d.waitForFunction(() => globalThis.__heard.includes("The agent stopped with an error."), null, { timeout: PATIENCE });
  const heardFailing = await d.evaluate(() => globalThis.__heard.filter((t) => t === "The agent stopped with an error.").length);
  check(heardFailing === 1, `a turn that failed is announced once (${heardFailing})`);
  const failed = await d.locator("#transcript .turn").nth(1).innerText();
  check(!failed.includes('{"') && /error|stopped/i.test(failed), `an error reads as words (${failed})`);
  // An agent that cannot start: the session says why, in place of a message box that would only fail.
  await d.selectOption("#new-session-agent", "broken");
  await d.fill("#new-session-dir", "brokenproj");
  await d.click("#create-session");
  await d.waitForSelector("#session-failed:not([hidden])", { timeout: PATIENCE });
  const why = await d.textContent("#session-failed");
  check(why.startsWith("The agent could not start:") && !why.includes('{"'), `a failed start is said (${why})`);
  check(await d.isHidden("#composer"), "and offers no message box");
  const brokenSession = await d.evaluate(() => globalThis.ahpRelay?.session());

  // The same on Alice's phone: the error in words, the edit that says how many turns go (its Send button: Return
  // is a new line there), and the failed start.
  await p.goto(`${base}/#s=${encodeURIComponent(singleSession)}`);
  await p.reload();
  await online(p);
  await idleWith(p, 2);
  const failedOnPhone = await p.locator("#transcript .turn").nth(1).innerText();
  check(!failedOnPhone.includes('{"') && /error|stopped/i.test(failedOnPhone), `on the phone too, an error reads as words (${failedOnPhone})`);
  await p.locator("#transcript .turn").first().locator(".edit-prompt").click();
  await p.fill("#transcript .edit-box", "first thing, edited on the phone");
  await p.click("#transcript .send-edit");
  await p.waitForSelector("#confirm-truncate[open]", { timeout: PATIENCE });
  const onPhoneTruncating = await p.textContent("#confirm-truncate-text");
  check(onPhoneTruncating.includes("2 turns") && onPhoneTruncating.includes("everyone"), `the phone's edit says how many turns go (${onPhoneTruncating})`);
  check(
    await p.evaluate(() => {
      const ok = document.getElementById("confirm-truncate-ok").getBoundingClientRect();
      return ok.bottom <= window.innerHeight && ok.right <= window.innerWidth && ok.top >= 0;
    }),
    "the phone's question and its buttons are in view",
  );
  await accessible(p, "team: phone, the truncation question", { serious: true });
  await p.click("#confirm-truncate-cancel");
  await p.reload();
  await online(p);
  await idleWith(p, 2);
  check(((await chatOf(p))?.turns ?? []).length === 2, "declined on the phone, nothing was removed");
  await p.goto(`${base}/#s=${encodeURIComponent(brokenSession)}`);
  await p.reload();
  await online(p);
  await p.waitForSelector("#session-failed:not([hidden])", { timeout: PATIENCE });
  const whyOnPhone = await p.textContent("#session-failed");
  check(whyOnPhone.startsWith("The agent could not start:") && !whyOnPhone.includes('{"'), `the phone says the start failed (${whyOnPhone})`);
  check(await p.isHidden("#composer"), "and offers no message box either");
  // The demo's session on the phone: no Files or Terminal; who answered and who approved are named there too.
  await p.goto(`${base}/#s=${encodeURIComponent(s2)}`);
  await p.reload();
  await online(p);
  await idleWith(p, 2);
  check((await p.isHidden("#files-toggle")) && (await p.isHidden("#terminal-toggle")), "the phone offers no Files or Terminal for a demo session");
  await p.fill("#prompt", "!ls");
  check(await p.isVisible("#command-hint"), "a !command on the phone's demo session says it runs nothing");
  await p.click("#composer-send");
  await idleWith(p, 3);
  const bangOnPhone = await p.locator("#transcript .turn").nth(2).innerText();
  check(!/killed|running|error/i.test(bangOnPhone) && (await p.locator("#transcript .turn").nth(2).locator(".turn-end").getAttribute("data-state")) === "complete", `the phone's demo answers !ls as a message (${bangOnPhone})`);
  check((await p.textContent("#transcript .input-request .answered-by")) === "answered by bob", "the phone says who answered");
  check((await p.textContent("#transcript .tool .decided-by")).includes("alice"), "and who approved");
  check((await p.locator("#transcript .turn .fork-turn").count()) >= 1, "the phone offers Fork on a completed turn");

  // The list groups sessions by when they last changed and says when.
  const groups = await b.evaluate(() => [...document.querySelectorAll("#sessions .session-group")].map((g) => g.textContent));
  check(groups.join(",") === "Today", `today's sessions are grouped under Today (${groups})`);
  const phoneGroups = await p.evaluate(() => [...document.querySelectorAll("#sessions .session-group")].map((g) => g.textContent));
  check(phoneGroups.join(",") === "Today", `and on the phone (${phoneGroups})`);
  check(/\d/.test(await b.textContent(`#sessions li[data-uri="${s1}"] .when`)), "each session says when it last changed");
  const grouped = await b.evaluate(() => {
    const now = new Date(2026, 10, 28, 9, 30);
    const at = (days, hour = 12) => new Date(2026, 10, 28 - days, hour).toISOString();
    return [at(0, 1), at(1, 23), at(3), at(20), at(45)].map((iso) => globalThis.ahpRelay.dayGroup(iso, now));
  });
  check(grouped.join(",") === "Today,Yesterday,Previous 7 days,Previous 30 days,Older", `the groups by day (${grouped})`);

  // Signing out takes the session's news out of the tab's title, on the desktop and the phone: Alice's demo
  // session waits for her input first, and both tabs' titles say so.
  await p.goto(`${base}/#s=${encodeURIComponent(s2)}`);
  await p.reload();
  await online(p);
  await idleWith(p, 3);
  await p.fill("#prompt", "Please use the tool then ask for input");
  await p.click("#composer-send");
  for (const page of [d, p]) {
    await page.waitForFunction(() => document.title.includes("needs input"), null, { timeout: PATIENCE });
    await page.click("#sign-out");
    await page.waitForSelector('body[data-view="signin"] #signin-token', { timeout: PATIENCE });
    check((await page.title()) === "Sign in · ahp-relay", `signed out, the tab's title no longer says a session needs input (${await page.title()})`);
  }

  check(problems.length === 0, `no page errors:\n${problems.join("\n")}`);
  console.log(JSON.stringify({ team: "ok", toBox, fromList, heard, accessibility }));
}

try {
  if (mode === "flow") await flow(rest[0], rest[1]);
  else if (mode === "signin") await signin(rest[0], rest[1], rest[2], rest[3], rest[4], rest[5]);
  else if (mode === "form") await form(rest[0], rest[1], rest[2]);
  else if (mode === "messages") await messages(rest[0], rest[1]);
  else if (mode === "search") await search(rest[0], rest[1]);
  else if (mode === "reduce") await reduce(rest[0], rest[1]);
  else if (mode === "workspace") await workspace(rest[0], rest[1], rest[2]);
  else if (mode === "demo") await demoChanges(rest[0], rest[1], rest[2]);
  else if (mode === "team") await team(rest[0], rest[1], rest[2], rest[3], rest[4]);
  else throw new Error(`unknown mode ${mode}`);
} catch (error) {
  console.error(error.stack ?? String(error));
  process.exitCode = 1;
  // What each page showed when the check failed, next to the test's other output.
  for (const [name, page] of opened) {
    const dir = mode === "flow" ? rest[1] : mode === "signin" ? rest[5] : mode === "form" ? rest[2] : mode === "messages" || mode === "search" ? rest[1] : mode === "workspace" || mode === "demo" ? rest[2] : mode === "team" ? rest[4] : undefined;
    if (dir) await page.screenshot({ path: join(dir, `failed-${name}.png`) }).catch(() => {});
    console.error(`${name} notes: ${await page.locator("#notes").innerText().catch(() => "?")}`);
  }
  for (const problem of problems) console.error(problem);
} finally {
  await browser.close();
}
