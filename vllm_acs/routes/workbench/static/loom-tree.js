// The sidebar's List view: the whole tree as one ARIA tree (flat rows with aria-level), a click
// selects a Node. Only the selected row is in the tab order; the arrow keys are the Loom's
// hotkeys (siblings, parent, first child), so the row that gets selected also gets the focus.

import { el } from "./dom.js";
import { originLabel, preview } from "./loom-model.js";

export function createTreeList({ model, onSelect }) {
  const element = el("div", { class: "tree-list", role: "tree", "aria-label": "Loom tree" });
  const rows = new Map();
  let selectedId = null;
  let onPath = new Set();

  element.addEventListener("click", (event) => {
    const row = event.target.closest(".tree-row");
    if (row) onSelect(row.dataset.nodeId, { focus: true });
  });
  element.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" && event.key !== " ") return;
    const row = event.target.closest(".tree-row");
    if (!row) return;
    event.preventDefault();
    onSelect(row.dataset.nodeId, { focus: true });
  });

  function label(node) {
    const parts = [
      el("span", { class: `origin-mark origin-${node.origin}`, title: originLabel(node) }, el("span", { class: "visually-hidden" }, `${originLabel(node)}: `)),
      el("span", { class: "row-text" }, node.parent_id === null && node.text === "" ? "(empty root)" : preview(node.text)),
      node.bookmarked ? el("span", { class: "bookmark-mark", title: "bookmarked" }, el("span", { "aria-hidden": "true" }, "★"), el("span", { class: "visually-hidden" }, " (bookmarked)")) : null,
      node.status === "generating" ? el("span", { class: "status-mark" }, " generating…") : null,
      node.status === "failed" ? el("span", { class: "status-mark failed" }, " failed") : null,
    ];
    return parts.filter(Boolean);
  }

  /** Builds every row again (after the tree changed). */
  function rebuild() {
    rows.clear();
    const built = model.ordered().map(({ node, depth, position, setSize }) => {
      const row = el(
        "div",
        {
          class: "tree-row",
          role: "treeitem",
          id: `tree-row-${node.id}`,
          tabindex: "-1",
          "aria-level": String(depth + 1),
          "aria-posinset": String(position),
          "aria-setsize": String(setSize),
          "aria-selected": "false",
          dataset: { nodeId: node.id },
        },
        ...label(node)
      );
      row.style.setProperty("--depth", String(depth));
      rows.set(node.id, row);
      return row;
    });
    element.replaceChildren(...built);
    const keep = selectedId;
    selectedId = null;
    onPath = new Set();
    if (keep) select(keep);
  }

  /** Marks the selected row and the path to it; scrolls it into view, focuses it on request. */
  function select(id, { focus = false } = {}) {
    const previous = rows.get(selectedId);
    if (previous) {
      previous.setAttribute("aria-selected", "false");
      previous.tabIndex = -1;
    }
    for (const pathId of onPath) rows.get(pathId)?.classList.remove("on-path");
    selectedId = id;
    onPath = new Set(model.path(id).map((node) => node.id));
    for (const pathId of onPath) rows.get(pathId)?.classList.add("on-path");
    const row = rows.get(id);
    if (!row) return;
    row.setAttribute("aria-selected", "true");
    row.tabIndex = 0;
    row.scrollIntoView({ block: "nearest" });
    if (focus) row.focus({ preventScroll: true });
  }

  /** One Node's row again (its text grew while streaming, its bookmark changed). */
  function update(id) {
    const row = rows.get(id);
    const node = model.node(id);
    if (row && node) row.replaceChildren(...label(node));
  }

  function focusSelected() {
    rows.get(selectedId)?.focus();
  }

  return { element, rebuild, select, update, focusSelected };
}
