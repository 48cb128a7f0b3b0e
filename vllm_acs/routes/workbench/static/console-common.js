// What the console's sections share: number and time formats, state badges, a table, and the two
// dialogs (confirm an action; set token budgets). Everything is built with el(), never from HTML.

import { el, formatTime } from "./dom.js";

export const NUMBER = new Intl.NumberFormat();

/** A token amount, or `none` for a budget of null (no cap). */
export function tokens(value, none = "no cap") {
  return value === null || value === undefined ? none : NUMBER.format(value);
}

export function when(unix, never = "never") {
  return unix ? formatTime(unix) : never;
}

/** "12 s ago", "3 min ago": how long before `now` (both Unix seconds). */
export function ago(unix, now) {
  const seconds = Math.max(0, Math.round(now - unix));
  if (seconds < 90) return `${seconds} s ago`;
  if (seconds < 90 * 60) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 36 * 3600) return `${Math.round(seconds / 3600)} h ago`;
  return formatTime(unix);
}

/** A state as a coloured pill (account.css's .state-* colours, console.css adds the rest). */
export function badge(state, text = state) {
  return el("span", { class: `state state-${state}` }, text);
}

/** A table with a caption, column heads (a head is a string, or [label, "num"] for a number). */
export function table(caption, heads, rows, empty = "Nothing to show.") {
  return el(
    "table",
    { class: "keys-table console-table" },
    el("caption", {}, caption),
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        heads.map((head) => {
          const [label, kind] = Array.isArray(head) ? head : [head, null];
          return el("th", { scope: "col", class: kind }, label);
        }),
      ),
    ),
    el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: heads.length, class: "empty" }, empty))),
  );
}

/** Asks before an action in `dialog`; resolves true when confirmed. */
export function confirmAction(dialog, { title, text, confirm, danger = false }) {
  return new Promise((resolve) => {
    const yes = el("button", { type: "button", class: danger ? "danger" : "primary" }, confirm);
    const no = el("button", { type: "button" }, "Cancel");
    dialog.replaceChildren(
      el("h2", { id: "console-dialog-title" }, title),
      el("p", {}, text),
      el("div", { class: "dialog-actions" }, no, yes),
    );
    const finish = (answer) => {
      dialog.close();
      resolve(answer);
    };
    no.addEventListener("click", () => finish(false));
    yes.addEventListener("click", () => finish(true));
    dialog.addEventListener("cancel", () => resolve(false), { once: true });
    dialog.showModal();
    no.focus();
  });
}

/**
 * Asks for token budgets in `dialog`: fields [{name, label, value}] as number inputs (empty: null,
 * no cap). Resolves {name: number|null} for the fields whose value changed, or null on Cancel.
 */
export function askBudgets(dialog, { title, hint, fields, extra = null }) {
  return new Promise((resolve) => {
    const inputs = fields.map((field) => {
      const input = el("input", {
        id: `budget-${field.name}`,
        type: "number",
        min: "0",
        step: "1",
        inputmode: "numeric",
        value: field.value === null || field.value === undefined ? "" : String(field.value),
      });
      return { field, input };
    });
    const save = el("button", { type: "submit", class: "primary" }, "Save");
    const cancel = el("button", { type: "button" }, "Cancel");
    const form = el(
      "form",
      { class: "budget-form" },
      el("h2", { id: "console-dialog-title" }, title),
      el("p", { class: "hint" }, hint),
      inputs.map(({ field, input }) => el("div", { class: "field" }, el("label", { for: input.id }, field.label), input)),
      extra?.element ?? null,
      el("div", { class: "dialog-actions" }, cancel, save),
    );
    dialog.replaceChildren(form);
    let done = false;
    const finish = (answer) => {
      if (done) return;
      done = true;
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    cancel.addEventListener("click", () => finish(null));
    dialog.addEventListener("cancel", () => finish(null), { once: true });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const changed = {};
      for (const { field, input } of inputs) {
        const value = input.value === "" ? null : Number(input.value);
        if (value !== (field.value ?? null)) changed[field.name] = value;
      }
      Object.assign(changed, extra?.changes() ?? {});
      finish(changed);
    });
    dialog.showModal();
    inputs[0]?.input.focus();
  });
}

/** The accounts by id ({id: name}), for the sections that show account ids. */
export async function accountNames(client) {
  const listed = await client.request("GET", "/v1/admin/accounts");
  return new Map(listed.data.map((account) => [account.id, account.name]));
}

/** A labelled <select> of `options` ([value, text]); `value` chosen. */
export function selectField(id, label, options, value) {
  const select = el(
    "select",
    { id },
    options.map(([optionValue, text]) => el("option", { value: optionValue, selected: optionValue === value }, text)),
  );
  return { select, row: el("div", { class: "field" }, el("label", { for: id }, label), select) };
}
