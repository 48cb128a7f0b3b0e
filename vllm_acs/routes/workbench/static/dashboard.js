// The Dashboard (#/dashboard): the account's keys with this month's spend, Create key (its secret
// shown once, with a copy button), Pause, Resume, and Revoke (confirmed first). A key without
// the `keys` scope sees only itself (GET /v1/keys answers it 403 scope_denied). A key just claimed
// with a claim code (apply.js) has its secret shown here once, above the rest.

import { ApiError, describeError } from "./api.js";
import { copyControls, el, formatTime } from "./dom.js";
import { takeCreatedKey } from "./session.js";

const NUMBER = new Intl.NumberFormat();
const BUDGETS = [
  ["monthly_tokens", "Monthly tokens"],
  ["daily_tokens", "Daily tokens"],
];

function tokens(value) {
  return value === null || value === undefined ? "no cap" : NUMBER.format(value);
}

function newIdempotencyKey() {
  return `dashboard-${crypto.randomUUID()}`;
}

export function mount(main, context) {
  const { client } = context;
  const ownPrefix = client.key.slice(0, 15);
  const alert = el("p", { class: "error", role: "alert", hidden: true });
  const status = el("p", { class: "hint", role: "status" });
  const body = el("div", { class: "dashboard-body" });
  const dialog = el("dialog", { class: "confirm card", "aria-labelledby": "confirm-title" });
  const claimed = el("div", { class: "new-key", hidden: true });
  main.replaceChildren(
    el("div", { class: "account-page" }, el("h1", {}, "Dashboard"), alert, status, claimed, body, dialog),
  );
  const created = takeCreatedKey();
  if (created) {
    showSecret(claimed, created, {
      title: "Your application was approved: this is your first API key",
      lost: "if you lose it, ask the operator for a new one.",
    });
  }

  function showError(error) {
    alert.textContent = describeError(error);
    alert.hidden = false;
  }

  async function load() {
    alert.hidden = true;
    try {
      const listed = await client.request("GET", "/v1/keys");
      renderKeys(listed.data);
      await showAccountTotal();
    } catch (error) {
      if (error instanceof ApiError && error.code === "scope_denied") {
        await renderOwnKey();
        return;
      }
      showError(error);
    }
  }

  async function renderOwnKey() {
    const usage = await client.request("GET", "/v1/usage").catch((error) => {
      showError(error);
      return null;
    });
    if (!usage) return;
    const monthly = usage.budgets.find((b) => b.name === "key_monthly");
    body.replaceChildren(
      el(
        "p",
        { class: "notice" },
        "This key does not have the keys scope, so it sees only itself. Ask the operator for a key that manages your account's keys.",
      ),
      el(
        "section",
        { class: "card", "aria-labelledby": "own-key-title" },
        el("h2", { id: "own-key-title" }, "This key"),
        el(
          "dl",
          { class: "account-facts" },
          el("dt", {}, "Prefix"),
          el("dd", {}, el("code", {}, usage.key_prefix)),
          el("dt", {}, "Spent this month"),
          el("dd", {}, `${NUMBER.format(monthly.spent)} tokens`),
          el("dt", {}, "Monthly budget"),
          el("dd", {}, tokens(monthly.limit)),
        ),
        el("p", {}, el("a", { href: "#/usage" }, "See the usage and budgets of this key")),
      ),
    );
  }

  /** The account's monthly total (set by the operator), spent across its keys. */
  async function showAccountTotal() {
    const usage = await client.request("GET", "/v1/usage");
    const account = usage.budgets.find((b) => b.name === "account_monthly");
    const text =
      account.limit === null
        ? `This month the account's keys spent ${NUMBER.format(account.spent)} tokens; the account has no monthly total.`
        : `This month the account's keys spent ${NUMBER.format(account.spent)} of its ${NUMBER.format(account.limit)} tokens (resets ${formatTime(account.resets_at)}).`;
    body.prepend(el("p", { class: "account-total" }, text));
  }

  function renderKeys(keys) {
    const rows = keys.map((key) => keyRow(key));
    const table = el(
      "table",
      { class: "keys-table" },
      el("caption", {}, "Keys of this account"),
      el(
        "thead",
        {},
        el(
          "tr",
          {},
          ["Name", "Prefix", "State", "Scopes", "This month", "Monthly budget", "Last used", "Actions"].map((h) =>
            el("th", { scope: "col" }, h),
          ),
        ),
      ),
      el("tbody", {}, rows),
    );
    body.replaceChildren(createForm(), el("section", { class: "card keys-card" }, table));
  }

  function keyRow(key) {
    const own = key.prefix === ownPrefix;
    const name = key.name ?? "(unnamed)";
    const buttons = el("div", { class: "key-actions" });
    const actions = el("td", {}, buttons);
    if (key.state === "active") {
      buttons.append(
        el("button", { type: "button", onclick: () => setState(key, "paused"), "aria-label": `Pause ${name}` }, "Pause"),
      );
    } else if (key.state === "paused") {
      buttons.append(
        el("button", { type: "button", onclick: () => setState(key, "active"), "aria-label": `Resume ${name}` }, "Resume"),
      );
    }
    if (key.state !== "revoked") {
      buttons.append(
        el(
          "button",
          { type: "button", class: "danger", onclick: () => confirmRevoke(key), "aria-label": `Revoke ${name}` },
          "Revoke",
        ),
      );
    }
    return el(
      "tr",
      { dataset: { keyId: key.id, state: key.state } },
      el("th", { scope: "row" }, name, own ? el("span", { class: "tag" }, "this key") : null),
      el("td", {}, el("code", {}, key.prefix)),
      el("td", {}, el("span", { class: `state state-${key.state}` }, key.state)),
      el("td", {}, key.scopes.join(", ")),
      el("td", { class: "num" }, NUMBER.format(key.month_spend)),
      el("td", { class: "num" }, tokens(key.budgets.monthly_tokens)),
      el("td", {}, key.last_used_at ? formatTime(key.last_used_at) : "never"),
      actions,
    );
  }

  function createForm() {
    const name = el("input", { id: "new-key-name", type: "text", maxlength: "200", autocomplete: "off" });
    const fields = BUDGETS.map(([field, label]) => {
      const input = el("input", { id: `new-key-${field}`, type: "number", min: "0", step: "1", inputmode: "numeric" });
      return { field, input, row: el("div", { class: "field" }, el("label", { for: input.id }, `${label} (optional)`), input) };
    });
    const submit = el("button", { type: "submit", class: "primary" }, "Create key");
    const result = el("div", { class: "new-key", hidden: true });
    let idempotencyKey = newIdempotencyKey();
    const form = el(
      "form",
      { class: "card create-key", "aria-labelledby": "create-key-title" },
      el("h2", { id: "create-key-title" }, "Create key"),
      el(
        "div",
        { class: "fields" },
        el("div", { class: "field" }, el("label", { for: name.id }, "Name"), name),
        fields.map((f) => f.row),
        submit,
      ),
      el("p", { class: "hint" }, "Left empty, a budget is the signed-in key's own. No budget may be above it, and the account's total still applies."),
      result,
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      alert.hidden = true;
      const payload = {};
      if (name.value.trim()) payload.name = name.value.trim();
      for (const { field, input } of fields) {
        if (input.value !== "") payload[field] = Number(input.value);
      }
      submit.disabled = true;
      try {
        // The same Idempotency-Key until it succeeds: a retried click never makes two keys.
        const created = await client.request("POST", "/v1/keys", {
          body: payload,
          headers: { "Idempotency-Key": idempotencyKey },
        });
        idempotencyKey = newIdempotencyKey();
        form.reset();
        showSecret(result, created);
        const listed = await client.request("GET", "/v1/keys");
        const table = body.querySelector("table tbody");
        table.replaceChildren(...listed.data.map((key) => keyRow(key)));
      } catch (error) {
        showError(error);
      } finally {
        submit.disabled = false;
      }
    });
    return form;
  }

  function showSecret(result, created, shown = {}) {
    const title = shown.title ?? `New key${created.name ? `: ${created.name}` : ""}`;
    const lost = shown.lost ?? "if you lose it, revoke it and create another.";
    const secret = el("input", {
      id: "new-key-secret",
      type: "text",
      readonly: true,
      value: created.key,
      class: "secret",
      spellcheck: "false",
    });
    const [copy, copied] = copyControls(secret, created.key, "key");
    result.replaceChildren(
      el("h3", {}, title),
      el(
        "p",
        { class: "warning", role: "note" },
        `Copy this key now: it will not be shown again. Only a hash of it is kept; ${lost}`,
      ),
      el("div", { class: "secret-row" }, el("label", { for: secret.id }, "New API key"), secret, copy, copied),
      el("button", { type: "button", onclick: () => { result.hidden = true; result.replaceChildren(); } }, "Done"),
    );
    result.hidden = false;
    secret.focus();
    secret.select();
  }

  async function setState(key, state) {
    alert.hidden = true;
    try {
      await client.request("PATCH", `/v1/keys/${encodeURIComponent(key.id)}`, { body: { state } });
      status.textContent = `${key.name ?? key.prefix} is ${state === "active" ? "active again" : "paused"}.`;
      await refreshRows();
    } catch (error) {
      showError(error);
    }
  }

  async function refreshRows() {
    const listed = await client.request("GET", "/v1/keys");
    body.querySelector("table tbody").replaceChildren(...listed.data.map((key) => keyRow(key)));
  }

  function confirmRevoke(key) {
    const name = key.name ?? key.prefix;
    const confirm = el("button", { type: "button", class: "danger" }, "Revoke key");
    const cancel = el("button", { type: "button" }, "Cancel");
    dialog.replaceChildren(
      el("h2", { id: "confirm-title" }, `Revoke ${name}?`),
      el("p", {}, "A revoked key is refused from its next request, for good. This cannot be undone."),
      el("div", { class: "dialog-actions" }, cancel, confirm),
    );
    cancel.addEventListener("click", () => dialog.close());
    confirm.addEventListener("click", async () => {
      dialog.close();
      alert.hidden = true;
      try {
        await client.request("DELETE", `/v1/keys/${encodeURIComponent(key.id)}`);
        status.textContent = `${name} is revoked.`;
        await refreshRows();
      } catch (error) {
        showError(error);
      }
    });
    dialog.showModal();
    cancel.focus();
  }

  load();
  return {
    unmount() {
      if (dialog.open) dialog.close();
    },
  };
}
