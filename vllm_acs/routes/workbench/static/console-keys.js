// Console: the keys of every account (or of one: #/console/keys/<account>). Scopes, budgets, this
// month's spend, last use; Pause / Resume (a pause by the operator: the researcher cannot undo
// it), Budgets (monthly and daily tokens), Revoke (confirmed first).

import { describeError } from "./api.js";
import { el } from "./dom.js";
import { NUMBER, accountNames, askBudgets, badge, confirmAction, selectField, table, tokens, when } from "./console-common.js";

const STATES = [
  ["", "Any state"],
  ["active", "Active"],
  ["paused", "Paused"],
  ["revoked", "Revoked"],
];

export async function mount(box, context) {
  const { client } = context;
  const alert = el("p", { class: "error", role: "alert", hidden: true });
  const status = el("p", { class: "hint", role: "status" });
  const tableBox = el("section", { class: "card keys-card" });
  const dialog = el("dialog", { class: "confirm card", "aria-labelledby": "console-dialog-title" });
  let names = new Map();
  try {
    names = await accountNames(client);
  } catch (error) {
    alert.textContent = describeError(error);
    alert.hidden = false;
  }
  const chosen = [...names.entries()].find(([id, name]) => id === context.account || name === context.account)?.[0] ?? "";
  const account = selectField("keys-account", "Account", [["", "All accounts"], ...[...names.entries()].map(([id, name]) => [id, name])], chosen);
  const state = selectField("keys-state", "State", STATES, "");
  box.replaceChildren(
    el("div", { class: "section-head" }, el("h2", {}, "Keys"), el("div", { class: "filters" }, account.row, state.row)),
    alert,
    status,
    tableBox,
    dialog,
  );
  account.select.addEventListener("change", () => {
    const target = account.select.value ? `#/console/keys/${encodeURIComponent(account.select.value)}` : "#/console/keys";
    history.replaceState(null, "", target); // the filter survives a reload, without remounting
    load();
  });
  state.select.addEventListener("change", () => load());

  // Each load is numbered: an answer that arrives after a newer load was asked is dropped (the
  // filters changed meanwhile), so the table never shows one filter's rows under another's title.
  let asked = 0;

  async function load() {
    const mine = ++asked;
    alert.hidden = true;
    const chosen = account.select.value;
    const query = new URLSearchParams();
    if (chosen) query.set("account_id", chosen);
    if (state.select.value) query.set("state", state.select.value);
    try {
      const listed = await client.request("GET", `/v1/admin/keys?${query}`);
      if (mine !== asked) return;
      const whose = chosen ? `of ${names.get(chosen)}` : "of every account";
      tableBox.replaceChildren(
        table(
          `Keys ${whose} (${listed.data.length})`,
          ["Key", "Account", "State", "Scopes", ["This month", "num"], ["Monthly budget", "num"], ["Daily budget", "num"], "Last used", "Actions"],
          listed.data.map(row),
          "No keys match.",
        ),
      );
    } catch (error) {
      alert.textContent = describeError(error);
      alert.hidden = false;
    }
  }

  function row(key) {
    const label = key.name ?? key.prefix;
    const actions = el("div", { class: "key-actions" });
    if (key.state === "active") {
      actions.append(el("button", { type: "button", "aria-label": `Pause ${label}`, onclick: () => patch(key, { state: "paused" }, `${label} is paused.`) }, "Pause"));
    } else if (key.state === "paused") {
      actions.append(el("button", { type: "button", "aria-label": `Resume ${label}`, onclick: () => patch(key, { state: "active" }, `${label} is active again.`) }, "Resume"));
    }
    if (key.state !== "revoked") {
      actions.append(
        el("button", { type: "button", "aria-label": `Budgets of ${label}`, onclick: () => editBudgets(key) }, "Budgets"),
        el("button", { type: "button", class: "danger", "aria-label": `Revoke ${label}`, onclick: () => revoke(key) }, "Revoke"),
      );
    }
    const pausedBy = key.state === "paused" && key.paused_by ? el("span", { class: "sub" }, key.paused_by === "operator" ? "by the operator" : `by ${key.paused_by}`) : null;
    return el(
      "tr",
      { dataset: { keyId: key.id, state: key.state } },
      el("th", { scope: "row" }, key.name ?? "(unnamed)", el("span", { class: "sub" }, el("code", {}, key.prefix))),
      el("td", { class: "nowrap" }, key.account_name ?? key.account_id),
      el("td", {}, badge(key.state), pausedBy),
      el("td", {}, el("div", { class: "scope-list" }, key.scopes.map((scope) => el("span", { class: `scope${scope === "admin" ? " scope-admin" : ""}` }, scope)))),
      el("td", { class: "num" }, NUMBER.format(key.month_spend)),
      el("td", { class: "num" }, tokens(key.limits.monthly_tokens)),
      el("td", { class: "num" }, tokens(key.limits.daily_tokens)),
      el("td", {}, when(key.last_used_at)),
      el("td", {}, actions),
    );
  }

  async function patch(key, body, done) {
    alert.hidden = true;
    try {
      await client.request("PATCH", `/v1/admin/keys/${encodeURIComponent(key.id)}`, { body });
      status.textContent = done;
      await load();
    } catch (error) {
      alert.textContent = describeError(error);
      alert.hidden = false;
    }
  }

  async function editBudgets(key) {
    const label = key.name ?? key.prefix;
    const changes = await askBudgets(dialog, {
      title: `Budgets of ${label}`,
      hint: "Tokens this key may spend (empty: no cap of its own; the account's monthly total still applies).",
      fields: [
        { name: "monthly_tokens", label: "Monthly tokens", value: key.limits.monthly_tokens },
        { name: "daily_tokens", label: "Daily tokens", value: key.limits.daily_tokens },
      ],
    });
    if (changes === null || Object.keys(changes).length === 0) return;
    await patch(key, changes, `${label}'s budgets are saved.`);
  }

  async function revoke(key) {
    const label = key.name ?? key.prefix;
    const sure = await confirmAction(dialog, {
      title: `Revoke ${label}?`,
      text: `A revoked key is refused (401 key_revoked) from its next request, for good. ${key.account_name ?? key.account_id} keeps its other keys.`,
      confirm: "Revoke key",
      danger: true,
    });
    if (!sure) return;
    alert.hidden = true;
    try {
      await client.request("DELETE", `/v1/admin/keys/${encodeURIComponent(key.id)}`);
      status.textContent = `${label} is revoked.`;
      await load();
    } catch (error) {
      alert.textContent = describeError(error);
      alert.hidden = false;
    }
  }

  await load();
  return {
    unmount() {
      if (dialog.open) dialog.close();
    },
  };
}
