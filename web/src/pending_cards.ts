// The cards a running turn waits on, in the panel under the transcript: a tool call to approve or deny, and the
// agent's questions as a form. What answering does is the caller's.

import { h } from "./dom";
import type { JsonObject } from "./rpc";

export function confirmationCard(call: JsonObject, decide: (approved: boolean) => void): HTMLElement {
  const approve = h("button", { type: "button", class: "approve" }, "Approve");
  const deny = h("button", { type: "button", class: "deny" }, "Deny");
  approve.addEventListener("click", () => decide(true));
  deny.addEventListener("click", () => decide(false));
  const input = typeof call.toolInput === "string" ? call.toolInput : JSON.stringify(call.toolInput ?? "", null, 2);
  return h(
    "div",
    { class: "card confirmation" },
    h("div", { class: "label" }, call.confirmationTitle?.value ?? call.confirmationTitle ?? `Run ${call.displayName ?? call.toolName}?`),
    h("pre", {}, input),
    h("div", { class: "actions" }, approve, deny),
  );
}

export function inputForm(request: JsonObject, answer: (form: HTMLFormElement, accept: boolean) => void): HTMLElement {
  const form = h("form", { class: "card input-form" });
  form.append(h("div", { class: "label" }, request.message ?? "The agent asks:"));
  for (const question of request.questions ?? []) {
    const label = h("label", {}, question.title ?? question.message ?? question.id);
    let field: HTMLElement;
    if (question.kind === "boolean") {
      field = h("input", { type: "checkbox", name: question.id });
    } else if (question.kind === "single-select" || question.kind === "multi-select") {
      field = h("select", question.kind === "multi-select" ? { name: question.id, multiple: "" } : { name: question.id },
        ...(question.options ?? []).map((o: JsonObject) => h("option", { value: o.id }, o.label ?? o.id)));
    } else {
      field = h("input", { type: question.kind === "number" || question.kind === "integer" ? "number" : "text", name: question.id, placeholder: question.message ?? "" });
      if (question.required) field.setAttribute("required", "");
    }
    label.append(field);
    form.append(label);
  }
  const decline = h("button", { type: "button", class: "deny" }, "Decline");
  decline.addEventListener("click", () => answer(form, false));
  form.append(h("div", { class: "actions" }, h("button", { type: "submit", class: "approve" }, "Answer"), decline));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    answer(form, true);
  });
  return form;
}
