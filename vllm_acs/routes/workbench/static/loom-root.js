// The root prompt (full-docs "1. Set a root"): a text box and **Set root (replaces tree)**, folded
// away once the tree has grown. Setting it again on a grown tree asks first, since it deletes
// every Node under the root.

import { el } from "./dom.js";

export function createRootCard({ onSet }) {
  const field = el("textarea", { id: "root-prompt", rows: "4", class: "mono", spellcheck: "false" });
  const confirm = el("div", { class: "confirm-row", hidden: true });
  const element = el(
    "details",
    { class: "card root-card" },
    el("summary", {}, "Root prompt"),
    el("label", { for: "root-prompt", class: "visually-hidden" }, "Root prompt"),
    field,
    el(
      "div",
      { class: "root-actions" },
      el("button", { type: "button", class: "primary small", onclick: () => onSet(field.value, { confirmed: !confirm.hidden }) }, "Set root (replaces tree)"),
      el("span", { class: "hint" }, "The root is your prompt verbatim; setting it again clears the tree.")
    ),
    confirm
  );

  function closeConfirm() {
    confirm.hidden = true;
    confirm.replaceChildren();
  }

  /** Asks before replacing a tree of `count` Nodes under the root. */
  function askReplace(count) {
    const yes = el("button", { type: "button", class: "small danger", onclick: () => onSet(field.value, { confirmed: true }) }, "Replace the tree");
    confirm.replaceChildren(
      el("span", {}, `Setting the root deletes the ${count} ${count === 1 ? "node" : "nodes"} under it.`),
      yes,
      el("button", { type: "button", class: "small", onclick: closeConfirm }, "Cancel")
    );
    confirm.hidden = false;
    yes.focus();
  }

  /** Shows the root's text, `folded` or not; the box has the focus while the root is empty. */
  function show(text, { folded }) {
    field.value = text;
    element.open = !folded;
    if (text === "") field.focus();
  }

  return { element, askReplace, closeConfirm, show };
}
