// Console: the audit log, newest first: every operator and key-management action (who, what, on
// which account and key, what changed). Filtered by action, account, key and actor; "Show older"
// pages back with the API's next_before.

import { describeError } from "./api.js";
import { el, formatTime } from "./dom.js";
import { accountNames, selectField } from "./console-common.js";

const ACTIONS = [
  ["", "Any action"],
  ["create", "Key created"],
  ["set", "Key changed"],
  ["pause", "Key paused"],
  ["resume", "Key resumed"],
  ["revoke", "Key revoked"],
  ["refuse", "Change refused"],
  ["account_create", "Account created"],
  ["account_set", "Account changed"],
  ["apply", "Applied"],
  ["approve", "Application approved"],
  ["reject", "Application rejected"],
  ["claim", "Key claimed"],
];
const ACTION_NAMES = new Map(ACTIONS);
const PAGE = 100;

function shown(value) {
  if (value === null || value === undefined) return "none";
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

/** "monthly_tokens: 77777 (was none), state: paused": what changed, and from what when told. */
function changesText(changes) {
  const { was = null, ...now } = changes ?? {};
  return Object.entries(now)
    .map(([name, value]) => {
      const before = was && typeof was === "object" && name in was ? ` (was ${shown(was[name])})` : "";
      return `${name}: ${shown(value)}${before}`;
    })
    .join(", ");
}

export async function mount(box, context) {
  const { client } = context;
  const alert = el("p", { class: "error", role: "alert", hidden: true });
  let names = new Map();
  try {
    names = await accountNames(client);
  } catch (error) {
    alert.textContent = describeError(error);
    alert.hidden = false;
  }
  const action = selectField("audit-action", "Action", ACTIONS, "");
  const account = selectField("audit-account", "Account", [["", "Any account"], ...names.entries()], context.account ?? "");
  const key = el("input", { id: "audit-key", type: "text", autocomplete: "off", spellcheck: "false", placeholder: "key_…" });
  const actor = el("input", { id: "audit-actor", type: "text", autocomplete: "off", spellcheck: "false", placeholder: "operator, key_… or app_…" });
  const filters = el(
    "form",
    { class: "filters audit-filters", role: "search", "aria-label": "Filter the audit log" },
    action.row,
    account.row,
    el("div", { class: "field" }, el("label", { for: key.id }, "Key id"), key),
    el("div", { class: "field" }, el("label", { for: actor.id }, "Actor"), actor),
    el("button", { type: "submit", class: "primary" }, "Filter"),
  );
  const tbody = el("tbody");
  const caption = el("caption", {}, "Audit log");
  const older = el("button", { type: "button", hidden: true }, "Show older");
  box.replaceChildren(
    el("div", { class: "section-head" }, el("h2", {}, "Audit log")),
    filters,
    alert,
    el(
      "section",
      { class: "card keys-card" },
      el(
        "table",
        { class: "keys-table console-table audit-table" },
        caption,
        el("thead", {}, el("tr", {}, ["When", "Actor", "Action", "Account", "Key", "Changes"].map((h) => el("th", { scope: "col" }, h)))),
        tbody,
      ),
      el("div", { class: "table-foot" }, older),
    ),
  );

  let next = null;
  let shown = 0;
  function params(before) {
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (action.select.value) query.set("action", action.select.value);
    if (account.select.value) query.set("account_id", account.select.value);
    if (key.value.trim()) query.set("key_id", key.value.trim());
    if (actor.value.trim()) query.set("actor", actor.value.trim());
    if (before) query.set("before", String(before));
    return query;
  }

  function row(event) {
    return el(
      "tr",
      { dataset: { action: event.action } },
      el("td", { class: "nowrap" }, formatTime(event.at)),
      el("td", {}, el("code", {}, event.actor)),
      el("td", {}, el("span", { class: `action action-${event.action}` }, ACTION_NAMES.get(event.action) ?? event.action)),
      el("td", {}, event.account_id ? names.get(event.account_id) ?? event.account_id : "-"),
      el("td", {}, event.key_id && event.key_id !== "-" ? el("code", {}, event.key_id) : "-"),
      el("td", { class: "changes" }, changesText(event.changes)),
    );
  }

  // Each load is numbered: an answer that arrives after a newer load was asked is dropped.
  let asked = 0;

  async function load(before = null) {
    const mine = ++asked;
    alert.hidden = true;
    try {
      const listed = await client.request("GET", `/v1/admin/audit?${params(before)}`);
      if (mine !== asked) return;
      if (!before) {
        tbody.replaceChildren();
        shown = 0;
      }
      tbody.append(...listed.data.map(row));
      shown += listed.data.length;
      if (shown === 0) tbody.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "empty" }, "No events match.")));
      caption.textContent = `Audit log: ${shown} event${shown === 1 ? "" : "s"}${listed.next_before ? ", newest first (more below)" : ", newest first"}`;
      next = listed.next_before;
      older.hidden = !next;
    } catch (error) {
      alert.textContent = describeError(error);
      alert.hidden = false;
    }
  }

  filters.addEventListener("submit", (event) => {
    event.preventDefault();
    load();
  });
  action.select.addEventListener("change", () => load());
  account.select.addEventListener("change", () => load());
  older.addEventListener("click", () => load(next));
  await load();
}
