// The selected Node's children, each a button with the start of its text (growing live while a
// branch streams): a click selects it.

import { el } from "./dom.js";
import { originLabel, preview } from "./loom-model.js";

export function createChildrenCard({ onSelect }) {
  const title = el("h2", { id: "children-title" }, "Children");
  const list = el("ul", { class: "children-list" });
  const element = el("section", { class: "card children-card", "aria-labelledby": "children-title" }, title, list);

  function show(children) {
    title.textContent = children.length ? `Children (${children.length})` : "Children";
    if (!children.length) {
      list.replaceChildren(
        el("li", { class: "hint" }, "None yet: ", el("strong", {}, "Branch from here"), " (", el("kbd", {}, "g"), ") asks the model for some.")
      );
      return;
    }
    list.replaceChildren(
      ...children.map((child) =>
        el(
          "li",
          {},
          el(
            "button",
            { type: "button", class: `child-button origin-${child.origin}`, onclick: () => onSelect(child.id) },
            el("span", { class: "child-origin" }, originLabel(child) + (child.status === "ready" ? "" : ` · ${child.status}`)),
            el("span", { class: "child-text" }, child.text === "" ? "…" : preview(child.text, 220))
          )
        )
      )
    );
  }

  return { element, show };
}
