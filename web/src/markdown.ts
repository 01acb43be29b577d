// Markdown from agents, rendered safely: the text is parsed into DOM nodes built with createElement and
// textContent, never assigned as HTML, so `<script>` or `<img onerror>` in a reply shows as text. Links keep
// only http(s) and mailto targets. Supported: paragraphs, headings, fenced code (highlighted, with a copy
// button) and inline code, bold, italics, lists, block quotes, tables and links — what agents write.

import { copyButton } from "./dom";
import { highlightInto } from "./highlight";

export function renderMarkdown(source: string): DocumentFragment {
  const out = document.createDocumentFragment();
  const lines = source.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)/);
    if (fence) {
      const body: string[] = [];
      i += 1;
      while (i < lines.length && !lines[i].trimStart().startsWith(fence[1])) {
        body.push(lines[i]);
        i += 1;
      }
      i += 1;
      out.append(codeBlock(body.join("\n"), fence[2] || undefined));
      continue;
    }
    if (!line.trim()) {
      i += 1;
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+([^]*)$/);
    if (heading) {
      const h = el(`h${Math.min(6, heading[1].length + 2)}`);
      h.append(inline(heading[2]));
      out.append(h);
      i += 1;
      continue;
    }
    if (/^\s*([-*+]|\d+[.)])\s+/.test(line)) {
      const ordered = /^\s*\d+[.)]\s+/.test(line);
      const list = el(ordered ? "ol" : "ul");
      while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
        const item = el("li");
        item.append(inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, "")));
        list.append(item);
        i += 1;
      }
      out.append(list);
      continue;
    }
    if (tableStarts(lines, i)) {
      const header = cells(line);
      const align = cells(lines[i + 1]).map((cell) =>
        /^:-+:$/.test(cell) ? "center" : /-+:$/.test(cell) ? "right" : /^:-+/.test(cell) ? "left" : "",
      );
      i += 2;
      const table = el("table");
      const head = el("thead");
      head.append(row(header, "th", align));
      const body = el("tbody");
      while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
        body.append(row(cells(lines[i]), "td", align, header.length));
        i += 1;
      }
      table.append(head, body);
      const scroller = el("div");
      scroller.className = "table";
      scroller.append(table);
      out.append(scroller);
      continue;
    }
    if (line.startsWith(">")) {
      const quote: string[] = [];
      while (i < lines.length && lines[i].startsWith(">")) {
        quote.push(lines[i].replace(/^>\s?/, ""));
        i += 1;
      }
      const block = el("blockquote");
      block.append(renderMarkdown(quote.join("\n")));
      out.append(block);
      continue;
    }
    const paragraph: string[] = [];
    while (
      i < lines.length &&
      lines[i].trim() &&
      !/^\s*(```|~~~)/.test(lines[i]) &&
      !/^#{1,6}\s/.test(lines[i]) &&
      !/^\s*([-*+]|\d+[.)])\s+/.test(lines[i]) &&
      !lines[i].startsWith(">") &&
      !tableStarts(lines, i)
    ) {
      paragraph.push(lines[i]);
      i += 1;
    }
    // Every line is some block's: should no rule above take this one, it is a paragraph of its own (the loop
    // always moves on, whatever the text).
    if (paragraph.length === 0) {
      paragraph.push(lines[i]);
      i += 1;
    }
    const p = el("p");
    p.append(inline(paragraph.join("\n")));
    out.append(p);
  }
  return out;
}

/** A fenced block: its code (highlighted when its language is known) and a button that copies it. */
function codeBlock(text: string, language: string | undefined): HTMLElement {
  const block = el("div");
  block.className = "code-block";
  const bar = el("div");
  bar.className = "code-bar";
  const label = el("span");
  label.textContent = language ?? "";
  const copy = copyButton(text, "copy-code", `Copy the ${language ? `${language} ` : ""}code`);
  bar.append(label, copy);
  const pre = el("pre");
  const code = el("code");
  if (language) code.dataset.lang = language;
  highlightInto(code, text, language);
  pre.append(code);
  block.append(bar, pre);
  return block;
}

/** A GFM table starts here: a row of cells, then a separator row (`| --- | :-: |`). */
function tableStarts(lines: string[], i: number): boolean {
  return (
    i + 1 < lines.length &&
    lines[i].includes("|") &&
    /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/.test(lines[i + 1]) &&
    cells(lines[i]).length === cells(lines[i + 1]).length
  );
}

/** A table row's cells (`\|` is a pipe inside a cell). */
function cells(line: string): string[] {
  const trimmed = line.trim().replace(/^\|/, "").replace(/(?<!\\)\|$/, "");
  return trimmed.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function row(values: string[], tag: "th" | "td", align: string[], width = values.length): HTMLElement {
  const tr = el("tr");
  for (let column = 0; column < width; column++) {
    const cell = el(tag);
    if (align[column]) cell.style.textAlign = align[column];
    cell.append(inline(values[column] ?? ""));
    tr.append(cell);
  }
  return tr;
}

/** Inline spans: `code`, **bold**, *italic* / _italic_, [text](url); everything else is text. */
function inline(text: string): DocumentFragment {
  const out = document.createDocumentFragment();
  // Underscores emphasize only between word boundaries (so snake_case and `__name` stay as written).
  const pattern =
    /`([^`]+)`|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|(?<![\w_])_([^_\s][^_]*)_(?![\w_])|\[([^\]]+)\]\(([^)\s]+)\)/g;
  let last = 0;
  for (const match of text.matchAll(pattern)) {
    const at = match.index ?? 0;
    if (at > last) out.append(text.slice(last, at));
    last = at + match[0].length;
    if (match[1] !== undefined) {
      const code = el("code");
      code.textContent = match[1];
      out.append(code);
    } else if (match[2] !== undefined) {
      const strong = el("strong");
      strong.append(inline(match[2]));
      out.append(strong);
    } else if (match[3] !== undefined || match[4] !== undefined) {
      const em = el("em");
      em.append(inline(match[3] ?? match[4]));
      out.append(em);
    } else {
      out.append(link(match[5], match[6]));
    }
  }
  if (last < text.length) out.append(text.slice(last));
  return out;
}

function link(label: string, href: string): Node {
  let url: URL;
  try {
    url = new URL(href);
  } catch {
    return document.createTextNode(`[${label}](${href})`);
  }
  if (!["http:", "https:", "mailto:"].includes(url.protocol)) {
    return document.createTextNode(`[${label}](${href})`);
  }
  const a = el("a") as HTMLAnchorElement;
  a.href = url.href;
  a.rel = "noopener noreferrer";
  a.target = "_blank";
  a.textContent = label;
  return a;
}

function el(tag: string): HTMLElement {
  return document.createElement(tag);
}
