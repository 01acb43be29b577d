// Syntax highlighting of fenced code in replies: lowlight (highlight.js grammars, bundled, no CDN) turns the
// code into a tree of classed spans, which is built here with createElement and text nodes — never as HTML —
// so highlighting cannot inject markup. Only languages a fence names (or their aliases) are highlighted.

import { createLowlight } from "lowlight";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import go from "highlight.js/lib/languages/go";
import ini from "highlight.js/lib/languages/ini";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import markdown from "highlight.js/lib/languages/markdown";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import shell from "highlight.js/lib/languages/shell";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";

const lowlight = createLowlight({
  bash, c, cpp, css, diff, go, ini, java, javascript, json, markdown, python, rust, shell, sql, typescript, xml, yaml,
});
lowlight.registerAlias({ ini: ["toml"], xml: ["html"], bash: ["sh", "zsh"], shell: ["console"] });

/** Longest code highlighted, in characters (beyond it the code stays plain: highlighting is not free). */
const MAX_HIGHLIGHTED = 100_000;

interface HastText {
  type: "text";
  value: string;
}
interface HastElement {
  type: "element";
  tagName: string;
  properties?: { className?: string[] };
  children: HastNode[];
}
type HastNode = HastText | HastElement | { type: string; children?: HastNode[] };

/** Fills `code` with `text`, highlighted when `language` is one this page knows. */
export function highlightInto(code: HTMLElement, text: string, language: string | undefined): void {
  if (!language || !lowlight.registered(language) || text.length > MAX_HIGHLIGHTED) {
    code.textContent = text;
    return;
  }
  const tree = lowlight.highlight(language, text);
  code.classList.add("hljs");
  code.replaceChildren(...tree.children.map((node) => build(node as HastNode)));
}

function build(node: HastNode): Node {
  if (node.type === "text") return document.createTextNode((node as HastText).value);
  const span = document.createElement("span");
  if (node.type === "element") {
    const classes = (node as HastElement).properties?.className ?? [];
    // Only highlight.js's own classes (`hljs-…`).
    for (const name of classes) if (/^hljs-[\w-]+$/.test(name)) span.classList.add(name);
  }
  for (const child of (node as HastElement).children ?? []) span.append(build(child));
  return span;
}
