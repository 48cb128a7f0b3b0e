// Console: Accounts. Status, this month's spend against the monthly total, the spend cap, the
// count of keys; Suspend / Resume (or Approve a pending one, confirmed first: an application's
// account is better approved in Applications), Budget (the monthly total and the spend cap),
// and a link to the account's keys.

import { describeError } from "./api.js";
import { el, formatTime } from "./dom.js";
import { NUMBER, askBudgets, badge, confirmAction, table, tokens } from "./console-common.js";

export function mount(box, context) {
  const { client } = context;
  const alert = el("p", { class: "error", role: "alert", hidden: true });
  const status = el("p", { class: "hint", role: "status" });
  const tableBox = el("section", { class: "card keys-card" });
  const dialog = el("dialog", { class: "confirm card", "aria-labelledby": "console-dialog-title" });
  box.replaceChildren(el("div", { class: "section-head" }, el("h2", {}, "Accounts")), alert, status, tableBox, dialog);

  async function load() {
    try {
      const listed = await client.request("GET", "/v1/admin/accounts");
      const period = listed.data[0]?.period ?? "";
      tableBox.replaceChildren(
        table(
          `Accounts (${listed.data.length})${period ? `: spend in ${period} (UTC)` : ""}`,
          ["Account", "Status", ["Spent this month", "num"], ["Monthly total", "num"], "Keys", "Created", "Actions"],
          listed.data.map(row),
          "No accounts yet.",
        ),
      );
    } catch (error) {
      showError(error);
    }
  }

  function showError(error) {
    alert.textContent = describeError(error);
    alert.hidden = false;
  }

  function row(account) {
    const name = account.name;
    const spent = el("span", {}, NUMBER.format(account.month_spend));
    const share = account.monthly_tokens ? Math.min(100, (100 * account.month_spend) / Math.max(1, account.monthly_tokens)) : null;
    const bar = share === null ? null : el("span", { class: "spend-bar", "aria-hidden": "true" }, el("span", {}));
    bar?.firstChild.style.setProperty("width", `${share.toFixed(1)}%`);
    const actions = el("div", { class: "key-actions" });
    if (account.status === "approved") {
      actions.append(el("button", { type: "button", "aria-label": `Suspend ${name}`, onclick: () => suspend(account) }, "Suspend"));
    } else if (account.status === "suspended") {
      actions.append(el("button", { type: "button", "aria-label": `Resume ${name}`, onclick: () => setStatus(account, "approved") }, "Resume"));
    } else if (account.status === "pending") {
      actions.append(el("button", { type: "button", "aria-label": `Approve ${name}`, onclick: () => approve(account) }, "Approve"));
    }
    actions.append(
      el("button", { type: "button", "aria-label": `Budget of ${name}`, onclick: () => editBudget(account) }, "Budget"),
      el("a", { class: "button-link", href: `#/console/keys/${encodeURIComponent(account.id)}`, "aria-label": `Keys of ${name}` }, "Keys"),
    );
    const keys = account.keys;
    return el(
      "tr",
      { dataset: { accountId: account.id } },
      el("th", { scope: "row" }, name, el("span", { class: "sub" }, account.id)),
      el("td", {}, badge(account.status), account.spend_capped ? badge("capped", "spend capped") : null),
      el("td", { class: "num" }, spent, bar),
      el("td", { class: "num" }, tokens(account.monthly_tokens, "none")),
      el("td", {}, `${keys.active} active`, keys.paused ? `, ${keys.paused} paused` : "", keys.revoked ? `, ${keys.revoked} revoked` : ""),
      el("td", { class: "nowrap" }, formatTime(account.created_at)),
      el("td", {}, actions),
    );
  }

  async function patch(account, body, done) {
    alert.hidden = true;
    try {
      await client.request("PATCH", `/v1/admin/accounts/${encodeURIComponent(account.id)}`, { body });
      status.textContent = done;
      await load();
    } catch (error) {
      showError(error);
    }
  }

  async function suspend(account) {
    const sure = await confirmAction(dialog, {
      title: `Suspend ${account.name}?`,
      text: "Every key of this account is refused (401 account_suspended) from its next request, until you resume the account.",
      confirm: "Suspend account",
      danger: true,
    });
    if (sure) await patch(account, { status: "suspended" }, `${account.name} is suspended.`);
  }

  async function approve(account) {
    const sure = await confirmAction(dialog, {
      title: `Approve ${account.name}?`,
      text: "Its keys may then be used. An account made by an application is better approved in Applications: that approves the application too, so the applicant can claim a key.",
      confirm: "Approve account",
    });
    if (sure) await patch(account, { status: "approved" }, `${account.name} is approved.`);
  }

  function setStatus(account, value) {
    return patch(account, { status: value }, `${account.name} is active again.`);
  }

  async function editBudget(account) {
    const capped = el("input", { id: "budget-spend-capped", type: "checkbox", checked: account.spend_capped });
    const changes = await askBudgets(dialog, {
      title: `Budget of ${account.name}`,
      hint: "The account's monthly total across all its keys (empty: none). A key's own budgets still apply.",
      fields: [{ name: "monthly_tokens", label: "Monthly tokens", value: account.monthly_tokens }],
      extra: {
        element: el("label", { class: "check" }, capped, " Spend cap: refuse every request (429 spend_cap)"),
        changes: () => (capped.checked !== account.spend_capped ? { spend_capped: capped.checked } : {}),
      },
    });
    if (changes === null || Object.keys(changes).length === 0) return;
    await patch(account, changes, `${account.name}'s budget is saved.`);
  }

  load();
  return {
    unmount() {
      if (dialog.open) dialog.close();
    },
  };
}
