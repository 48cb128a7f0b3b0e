// The list of the key's Looms (#/loom): ＋ New loom, Import JSON, open, rename, delete. Looms whose
// title starts with `workbench:` are the single pane's own history: hidden unless the user ticks
// "Show Workbench history" (remembered in localStorage).

import { describeError } from "./api.js";
import { el, formatTime } from "./dom.js";
import { loomsApi } from "./loom-actions.js";
import { FileNotJson, jsonFilePicker } from "./loom-files.js";

export const WORKBENCH_PREFIX = "workbench:";
const SHOW_HISTORY_KEY = "vllm-acs.loom.show-workbench-history";

export function isWorkbenchLoom(loom) {
  return (loom.title ?? "").startsWith(WORKBENCH_PREFIX);
}

export function loomTitle(loom) {
  return loom.title?.trim() ? loom.title : "Untitled loom";
}

export function mountList(main, context) {
  const api = loomsApi(context.client);
  let looms = [];
  let hasMore = false;

  const alert = el("p", { class: "error", role: "alert", hidden: true });
  const status = el("p", { class: "loom-status", role: "status" });
  const showHistory = el("input", { type: "checkbox", id: "show-workbench-history" });
  showHistory.checked = localStorage.getItem(SHOW_HISTORY_KEY) === "true";
  const picker = jsonFilePicker();
  const body = el("tbody");
  const table = el(
    "table",
    { class: "loom-table" },
    el("caption", { class: "visually-hidden" }, "Your looms, newest first"),
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        el("th", { scope: "col" }, "Title"),
        el("th", { scope: "col", class: "num" }, "Nodes"),
        el("th", { scope: "col" }, "Updated"),
        el("th", { scope: "col" }, el("span", { class: "visually-hidden" }, "Actions"))
      )
    ),
    body
  );
  const empty = el("p", { class: "loom-empty", hidden: true });
  const more = el("button", { type: "button", hidden: true, onclick: () => load(looms.at(-1)?.id) }, "Load more");

  function fail(error) {
    alert.textContent = describeError(error);
    alert.hidden = false;
  }

  async function load(after = null) {
    alert.hidden = true;
    try {
      const page = await api.list(after);
      looms = after ? [...looms, ...page.data] : page.data;
      hasMore = page.has_more;
      render();
    } catch (error) {
      fail(error);
    }
  }

  async function createLoom() {
    alert.hidden = true;
    try {
      const loom = await api.create("");
      context.navigate(`#/loom/${loom.id}`);
    } catch (error) {
      fail(error);
    }
  }

  async function importLoom() {
    alert.hidden = true;
    try {
      const document = await picker.pick();
      if (document === null) return;
      const loom = await api.importFile(document);
      context.navigate(`#/loom/${loom.id}`);
    } catch (error) {
      fail(error instanceof FileNotJson ? error.message : error);
    }
  }

  function row(loom) {
    const name = loomTitle(loom);
    const titleCell = el(
      "td",
      { class: "loom-title-cell" },
      el("a", { href: `#/loom/${loom.id}`, class: "loom-link" }, name),
      isWorkbenchLoom(loom) ? el("span", { class: "badge" }, "Workbench") : null
    );
    const actions = el("td", { class: "row-actions" });
    const tr = el(
      "tr",
      {},
      titleCell,
      el("td", { class: "num" }, String(loom.node_count)),
      el("td", {}, el("time", { datetime: new Date(loom.updated_at * 1000).toISOString() }, formatTime(loom.updated_at))),
      actions
    );

    function showActions() {
      actions.replaceChildren(
        el("button", { type: "button", class: "small", "aria-label": `Rename ${name}`, onclick: rename }, "Rename"),
        el("button", { type: "button", class: "small danger", "aria-label": `Delete ${name}`, onclick: confirmDelete }, "Delete")
      );
    }

    function rename() {
      const field = el("input", { type: "text", value: loom.title ?? "", maxlength: "200", "aria-label": `New title for ${name}` });
      const save = async () => {
        try {
          const changed = await api.retitle(loom.id, field.value.trim() || null);
          Object.assign(loom, { title: changed.title, updated_at: changed.updated_at });
          status.textContent = `Renamed to “${loomTitle(loom)}”.`;
          render();
          body.querySelector(`a[href="#/loom/${loom.id}"]`)?.focus();
        } catch (error) {
          fail(error);
        }
      };
      field.addEventListener("keydown", (event) => {
        if (event.key === "Enter") save();
        if (event.key === "Escape") {
          event.preventDefault();
          render();
        }
      });
      titleCell.replaceChildren(field);
      actions.replaceChildren(
        el("button", { type: "button", class: "small primary", onclick: save }, "Save"),
        el("button", { type: "button", class: "small", onclick: () => render() }, "Cancel")
      );
      field.focus();
      field.select();
    }

    function confirmDelete() {
      const cancel = el("button", { type: "button", class: "small", onclick: showActions }, "Cancel");
      const doIt = el(
        "button",
        {
          type: "button",
          class: "small danger",
          onclick: async () => {
            try {
              await api.remove(loom.id);
              looms = looms.filter((l) => l !== loom);
              status.textContent = `Deleted “${name}”.`;
              render();
            } catch (error) {
              fail(error);
            }
          },
        },
        "Delete loom"
      );
      actions.replaceChildren(el("span", { class: "confirm-text" }, `Delete it and its ${loom.node_count} nodes?`), doIt, cancel);
      doIt.focus();
    }

    showActions();
    return tr;
  }

  function render() {
    const shown = looms.filter((loom) => showHistory.checked || !isWorkbenchLoom(loom));
    const hidden = looms.length - shown.length;
    body.replaceChildren(...shown.map(row));
    table.hidden = shown.length === 0;
    empty.hidden = shown.length > 0;
    empty.textContent =
      looms.length === 0
        ? "No looms yet. ＋ New loom starts one from a prompt; Import JSON loads a saved tree."
        : `Only Workbench history here (${hidden} looms): tick “Show Workbench history” to see it.`;
    more.hidden = !hasMore;
  }

  showHistory.addEventListener("change", () => {
    localStorage.setItem(SHOW_HISTORY_KEY, String(showHistory.checked));
    render();
  });

  main.replaceChildren(
    el(
      "div",
      { class: "loom-list-page" },
      el(
        "div",
        { class: "loom-list-head" },
        el("h1", {}, "Looms"),
        el(
          "div",
          { class: "loom-list-actions" },
          // The spec's name; the plus is drawn (many fonts have no full-width ＋).
          el("button", { type: "button", class: "primary", "aria-label": "＋ New loom", onclick: createLoom }, el("span", { class: "plus-icon", "aria-hidden": "true" }), "New loom"),
          el("button", { type: "button", onclick: importLoom }, "Import JSON"),
          picker.input
        )
      ),
      el(
        "p",
        { class: "hint" },
        "A loom is a tree of continuations: branch a prompt several ways, pick one, keep going, backtrack. Each is saved on the node, private to your key."
      ),
      el("label", { class: "check" }, showHistory, " Show Workbench history"),
      alert,
      status,
      el("div", { class: "card loom-table-card" }, table, empty, more)
    )
  );
  load();
  return null;
}
