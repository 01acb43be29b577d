// Building DOM nodes from text: every string becomes a text node, so nothing here can inject markup. Also the
// page's one "Copy" button.

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

/** A "Copy" button that puts `text` on the clipboard and says whether it did. */
export function copyButton(text: string, className: string, title?: string): HTMLButtonElement {
  const copy = h("button", { type: "button", class: `link ${className}`, ...(title ? { title } : {}) }, "Copy");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text);
      copy.textContent = "Copied";
    } catch {
      copy.textContent = "Copy failed";
    }
  });
  return copy;
}
