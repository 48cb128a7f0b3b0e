// The selected Node's panel: what it is (origin, status, its generation: model, checkpoint, seed,
// parameters; its score), its actions (Edit, Split at cursor, New sibling, Delete, Bookmark,
// Replay, Score) and the edit box those open (Save edit, Split here, Add sibling). The buttons
// stay the same elements from Node to Node, so the focus stays where it was; the page decides
// what each does (`actions`).

import { el, formatTime } from "./dom.js";
import { originLabel } from "./loom-model.js";

const EDITOR_MODES = {
  edit: { label: "Node text", commit: "Save edit", hint: "Editing drops the node's heatmap: logprobs belong to the text the model wrote." },
  split: { label: "Node text: place the cursor where the node splits", commit: "Split here", hint: "The node keeps the text before the cursor; a new child takes the rest and the node's children." },
  sibling: { label: "New sibling text", commit: "Add sibling", hint: "A hand-written alternative next to this node (same parent)." },
};

function button(label, onclick, { kbd, cls = "small" } = {}) {
  return el("button", { type: "button", class: cls, onclick, "aria-keyshortcuts": kbd ?? null }, label);
}

export function createNodePanel(actions) {
  const title = el("h2", { id: "node-title" }, "Node");
  const badges = el("span", { class: "node-badges" });
  const buttons = {
    edit: button("Edit", actions.edit, { kbd: "e" }),
    split: button("Split at cursor", actions.split, { kbd: "s" }),
    sibling: button("New sibling", actions.newSibling, { kbd: "i" }),
    remove: button("Delete", actions.remove, { kbd: "Delete", cls: "small danger" }),
    bookmark: button("Bookmark", actions.bookmark),
    replay: button("Replay", actions.replay),
    score: button("Score", actions.score),
  };
  buttons.bookmark.setAttribute("aria-pressed", "false");
  const editorField = el("textarea", { id: "node-editor", rows: "6", class: "mono", spellcheck: "false" });
  const editorLabel = el("label", { for: "node-editor" });
  const editorHint = el("p", { class: "hint" });
  const commit = el("button", { type: "button", class: "small primary", onclick: () => actions.commit() });
  const editor = el(
    "div",
    { class: "node-editor", hidden: true },
    editorLabel,
    editorField,
    editorHint,
    el("div", { class: "editor-actions" }, commit, button("Cancel", () => actions.cancel()), el("span", { class: "hint" }, el("kbd", {}, "Esc"), " cancels"))
  );
  const confirm = el("div", { class: "confirm-row", hidden: true });
  const result = el("div", { class: "node-result", role: "status" });
  const details = el("div", { class: "node-details" });

  const element = el(
    "section",
    { class: "card node-card", "aria-labelledby": "node-title" },
    el("div", { class: "card-head" }, title, badges),
    el(
      "div",
      { class: "node-actions", role: "group", "aria-label": "Node actions" },
      buttons.edit,
      buttons.split,
      buttons.sibling,
      buttons.bookmark,
      buttons.replay,
      buttons.score,
      buttons.remove
    ),
    confirm,
    editor,
    result,
    details
  );

  /** Shows `node` and the actions it allows now (none while a change runs: `busy`). */
  function show(node, { busy = false } = {}) {
    const isRoot = node.parent_id === null;
    const ready = node.status === "ready";
    badges.replaceChildren(
      ...[
        el("span", { class: `badge origin-${node.origin}` }, originLabel(node)),
        node.status !== "ready" ? el("span", { class: `badge status-${node.status}` }, node.status) : null,
        node.bookmarked ? el("span", { class: "badge bookmarked" }, "★ bookmarked") : null,
      ].filter(Boolean)
    );
    buttons.edit.disabled = busy || !ready;
    buttons.split.disabled = busy || !ready || node.text.length < 2;
    buttons.sibling.disabled = busy || isRoot;
    buttons.sibling.title = isRoot ? "The root has no siblings: start a new loom instead" : "";
    buttons.remove.disabled = busy || isRoot;
    buttons.remove.title = isRoot ? "The root stays: delete the loom from the list instead" : "";
    buttons.bookmark.disabled = busy;
    buttons.bookmark.setAttribute("aria-pressed", String(Boolean(node.bookmarked)));
    buttons.bookmark.replaceChildren(el("span", { "aria-hidden": "true" }, node.bookmarked ? "★ " : "☆ "), "Bookmark");
    const replayable = node.origin === "model" && ready && Boolean(node.generation?.prompt_token_ids);
    buttons.replay.hidden = !replayable;
    buttons.replay.disabled = busy;
    buttons.score.disabled = busy || !ready || node.text === "";
    details.replaceChildren(...describe(node));
  }

  function openEditor(mode, text) {
    const { label, commit: commitLabel, hint } = EDITOR_MODES[mode];
    editorLabel.textContent = label;
    commit.textContent = commitLabel;
    editorHint.textContent = hint;
    editorField.value = text;
    editor.hidden = false;
    editor.dataset.mode = mode;
    editorField.focus();
    if (mode === "split") {
      const middle = text.indexOf(" ", Math.floor(text.length / 2));
      const at = middle > 0 ? middle : Math.floor(text.length / 2);
      editorField.setSelectionRange(at, at);
    } else {
      editorField.setSelectionRange(text.length, text.length);
    }
  }

  function closeEditor() {
    const was = !editor.hidden;
    editor.hidden = true;
    delete editor.dataset.mode;
    return was;
  }

  /** Asks before a delete that takes a subtree: `Delete N nodes` / Cancel. */
  function askDelete(count, onYes) {
    const yes = button(`Delete ${count} nodes`, () => {
      closeConfirm();
      onYes();
    }, { cls: "small danger" });
    confirm.replaceChildren(
      el("span", {}, `This node has ${count - 1} below it: delete all ${count}?`),
      yes,
      button("Cancel", () => {
        closeConfirm();
        buttons.remove.focus();
      })
    );
    confirm.hidden = false;
    yes.focus();
  }

  function closeConfirm() {
    const was = !confirm.hidden;
    confirm.hidden = true;
    confirm.replaceChildren();
    return was;
  }

  function say(...content) {
    result.replaceChildren(...content);
  }

  return {
    element,
    buttons,
    show,
    openEditor,
    closeEditor,
    askDelete,
    closeConfirm,
    say,
    get editorMode() {
      return editor.hidden ? null : editor.dataset.mode;
    },
    get editorField() {
      return editorField;
    },
  };
}

function parametersText(parameters) {
  return Object.entries(parameters ?? {})
    .filter(([, value]) => value !== null && value !== undefined)
    .map(([name, value]) => `${name} ${Array.isArray(value) ? JSON.stringify(value) : value}`)
    .join(" · ");
}

/** What the panel says of a Node: its generation, its score, its error. */
function describe(node) {
  const parts = [];
  const generation = node.generation;
  if (generation && typeof generation === "object") {
    const rows = [
      ["Model", generation.model],
      ["Checkpoint", generation.checkpoint],
      ["Seed", generation.seed ?? null],
      ["Parameters", parametersText(generation.parameters) || null],
      ["Finish reason", generation.finish_reason],
      ["Generated", typeof generation.created_at === "number" ? formatTime(generation.created_at) : null],
    ].filter(([, value]) => value !== null && value !== undefined && value !== "");
    if (rows.length) {
      parts.push(
        el("h3", {}, node.origin === "split" ? "Generation (of the node it was split from)" : "Generation"),
        el("dl", { class: "facts" }, rows.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, String(value))]))
      );
    }
  } else if (node.origin === "human" || node.origin === "root") {
    parts.push(el("p", { class: "hint" }, node.origin === "root" ? "Your prompt, verbatim." : "Written by hand."));
  }
  if (node.score?.tokens) {
    const known = node.score.tokens.filter((t) => typeof t.logprob === "number");
    const total = known.reduce((sum, t) => sum + t.logprob, 0);
    parts.push(
      el(
        "p",
        { class: "hint" },
        `Scored by ${node.score.model}: ${node.score.tokens.length} tokens, total logprob ${total.toFixed(2)}.`
      )
    );
  }
  if (node.error) {
    parts.push(el("p", { class: "error" }, `${node.error.error?.code ?? node.error.code ?? "error"}: ${node.error.error?.message ?? node.error.message ?? ""}`));
  }
  return parts;
}
