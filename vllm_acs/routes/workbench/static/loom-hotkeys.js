// The Loom's hotkeys (full-docs "Hotkeys") and the `?` legend. A key acts only while no text
// field has the focus (dom.js typingInField), never with Ctrl, Alt or Meta held, and, while the
// legend is open, only `?` and Esc do anything. Esc is the one key a field may pass on: it
// cancels an edit from inside the edit box.

import { el, typingInField } from "./dom.js";

export const HOTKEYS = [
  { keys: ["↑", "↓"], action: "Previous / next sibling" },
  { keys: ["←"], action: "Go to parent" },
  { keys: ["→"], action: "Go to first child" },
  { keys: ["g"], action: "Generate branches from the selected node" },
  { keys: ["e"], action: "Edit the node's text" },
  { keys: ["s"], action: "Split the node at the cursor" },
  { keys: ["i"], action: "Insert a new sibling" },
  { keys: ["Delete"], action: "Delete the node and its subtree" },
  { keys: ["Esc"], action: "Cancel an edit / close the legend" },
  { keys: ["?"], action: "Toggle the shortcut legend" },
];

const KEY_ACTIONS = {
  ArrowUp: "previousSibling",
  ArrowDown: "nextSibling",
  ArrowLeft: "parent",
  ArrowRight: "firstChild",
  g: "branch",
  e: "edit",
  s: "split",
  i: "newSibling",
  Delete: "remove",
  "?": "legend",
};

/** The legend: a modal <dialog> (Esc closes it natively, the focus goes back where it was). */
export function createLegend() {
  const close = el("button", { type: "button", class: "small" }, "Close");
  const dialog = el(
    "dialog",
    { class: "legend", "aria-labelledby": "legend-title" },
    el("h2", { id: "legend-title" }, "Keyboard shortcuts"),
    el("p", { class: "hint" }, "They work whenever the cursor is not in a text box; while you type, letters are just letters."),
    el(
      "table",
      {},
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Key"), el("th", { scope: "col" }, "Action"))),
      el(
        "tbody",
        {},
        HOTKEYS.map(({ keys, action }) =>
          el("tr", {}, el("td", {}, keys.flatMap((key, k) => [k ? " / " : null, el("kbd", {}, key)])), el("td", {}, action))
        )
      )
    ),
    el("div", { class: "legend-actions" }, close)
  );
  close.addEventListener("click", () => dialog.close());
  dialog.addEventListener("click", (event) => {
    if (event.target === dialog) dialog.close(); // a click on the backdrop
  });
  return {
    element: dialog,
    get open() {
      return dialog.open;
    },
    toggle() {
      if (dialog.open) dialog.close();
      else dialog.showModal();
    },
    close: () => dialog.open && dialog.close(),
  };
}

/**
 * Listens for the hotkeys on the document: `actions` has one function per action name above
 * plus `escape`; `legend` is createLegend()'s. Returns the function that stops listening.
 */
export function bindHotkeys(actions, legend) {
  function onKeyDown(event) {
    if (event.defaultPrevented || event.ctrlKey || event.altKey || event.metaKey || event.isComposing) return;
    if (event.key === "Escape") {
      if (legend.open) return; // the dialog closes itself
      if (actions.escape()) event.preventDefault();
      return;
    }
    if (typingInField(event.target)) return;
    const action = KEY_ACTIONS[event.key];
    if (!action) return;
    if (legend.open && action !== "legend") return;
    event.preventDefault();
    if (action === "legend") legend.toggle();
    else actions[action]();
  }
  document.addEventListener("keydown", onKeyDown);
  return () => document.removeEventListener("keydown", onKeyDown);
}
