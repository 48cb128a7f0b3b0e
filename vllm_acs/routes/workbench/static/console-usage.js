// Console: usage across accounts in one UTC month: the per-day rows of GET /v1/admin/usage summed
// by account, key, model, workload or day (the page sums, as docs/admin-console.md says), with
// each group's share of the month's tokens, and the rows as CSV (the API's own export).

import { describeError } from "./api.js";
import { el } from "./dom.js";
import { download } from "./loom-files.js";
import { NUMBER, accountNames, selectField, table } from "./console-common.js";

const GROUPS = [
  { name: "account", title: "Account", key: (r) => r.account_name ?? r.account_id ?? "(none)" },
  { name: "key", title: "Key", key: (r) => (r.key_prefix ? `${r.key_prefix} (${r.account_name ?? r.account_id})` : "(none)") },
  { name: "model", title: "Model", key: (r) => r.model ?? "(none)" },
  { name: "workload", title: "Workload", key: (r) => r.workload ?? "(none)" },
  { name: "date", title: "Day (UTC)", key: (r) => r.date },
];

function thisMonth() {
  return new Date().toISOString().slice(0, 7);
}

function summed(rows, group) {
  const groups = new Map();
  for (const row of rows) {
    const name = group.key(row);
    const sum = groups.get(name) ?? { name, requests: 0, prompt: 0, completion: 0, activations: 0 };
    sum.requests += row.requests;
    sum.prompt += row.prompt_tokens;
    sum.completion += row.completion_tokens;
    sum.activations += row.activation_requests;
    groups.set(name, sum);
  }
  const list = [...groups.values()];
  if (group.name === "date") return list.sort((a, b) => a.name.localeCompare(b.name));
  return list.sort((a, b) => b.prompt + b.completion - (a.prompt + a.completion));
}

export async function mount(box, context) {
  const { client } = context;
  const alert = el("p", { class: "error", role: "alert", hidden: true });
  const month = el("input", { id: "usage-month", type: "month", value: thisMonth(), required: true });
  let names = new Map();
  try {
    names = await accountNames(client);
  } catch (error) {
    alert.textContent = describeError(error);
    alert.hidden = false;
  }
  const account = selectField("usage-account", "Account", [["", "All accounts"], ...names.entries()], "");
  const groupButtons = GROUPS.map((group) =>
    el("button", { type: "button", class: "segment", "aria-pressed": String(group.name === "account"), dataset: { group: group.name } }, group.title),
  );
  const exportButton = el("button", { type: "button" }, "Download CSV");
  const totals = el("dl", { class: "usage-totals" });
  const summaryTitle = el("h3", { id: "usage-summary-title" }, "Tokens in the month");
  const tableBox = el("div", { class: "table-scroll" });
  let grouping = GROUPS[0];
  let rows = [];
  box.replaceChildren(
    el(
      "div",
      { class: "section-head" },
      el("h2", {}, "Usage"),
      el(
        "div",
        { class: "filters" },
        el("div", { class: "field" }, el("label", { for: month.id }, "Month (UTC)"), month),
        account.row,
        exportButton,
      ),
    ),
    alert,
    el(
      "section",
      { class: "card", "aria-labelledby": "usage-summary-title" },
      el("div", { class: "card-head" }, summaryTitle, el("div", { class: "segmented", role: "group", "aria-label": "Group by" }, groupButtons)),
      totals,
      tableBox,
    ),
  );

  function query(format) {
    const params = new URLSearchParams({ period: month.value || thisMonth() });
    if (account.select.value) params.set("account_id", account.select.value);
    if (format) params.set("format", format);
    return params;
  }

  function draw() {
    for (const button of groupButtons) button.setAttribute("aria-pressed", String(button.dataset.group === grouping.name));
    summaryTitle.textContent = `Tokens in ${month.value} (UTC)`;
    const groups = summed(rows, grouping);
    const all = groups.reduce((sum, g) => sum + g.prompt + g.completion, 0);
    const requests = groups.reduce((sum, g) => sum + g.requests, 0);
    totals.replaceChildren(
      el("div", {}, el("dt", {}, "Tokens"), el("dd", {}, NUMBER.format(all))),
      el("div", {}, el("dt", {}, "Requests"), el("dd", {}, NUMBER.format(requests))),
      el("div", {}, el("dt", {}, "Accounts"), el("dd", {}, NUMBER.format(new Set(rows.map((r) => r.account_id)).size))),
      el("div", {}, el("dt", {}, "Keys"), el("dd", {}, NUMBER.format(new Set(rows.map((r) => r.key_id)).size))),
    );
    const body = groups.map((g) => {
      const total = g.prompt + g.completion;
      const bar = el("span", { class: "spend-bar", "aria-hidden": "true" }, el("span", {}));
      bar.firstChild.style.setProperty("width", `${all ? ((100 * total) / all).toFixed(1) : 0}%`);
      return el(
        "tr",
        {},
        el("th", { scope: "row" }, grouping.name === "model" || grouping.name === "key" ? el("code", {}, g.name) : g.name),
        el("td", { class: "num" }, NUMBER.format(g.requests)),
        el("td", { class: "num" }, NUMBER.format(g.prompt)),
        el("td", { class: "num" }, NUMBER.format(g.completion)),
        el("td", { class: "num" }, NUMBER.format(total), bar),
        el("td", { class: "num" }, NUMBER.format(g.activations)),
      );
    });
    tableBox.replaceChildren(
      table(
        `Usage by ${grouping.title.toLowerCase()} in ${month.value}`,
        [grouping.title, ["Requests", "num"], ["Prompt tokens", "num"], ["Completion tokens", "num"], ["Total tokens", "num"], ["Activation requests", "num"]],
        body,
        "No requests in this month.",
      ),
    );
  }

  // Each load is numbered: an answer that arrives after a newer load was asked is dropped.
  let asked = 0;

  async function load() {
    const mine = ++asked;
    alert.hidden = true;
    try {
      const usage = await client.request("GET", `/v1/admin/usage?${query()}`);
      if (mine !== asked) return;
      rows = usage.rows;
      draw();
    } catch (error) {
      alert.textContent = describeError(error);
      alert.hidden = false;
    }
  }

  for (const button of groupButtons) {
    button.addEventListener("click", () => {
      grouping = GROUPS.find((g) => g.name === button.dataset.group);
      draw();
    });
  }
  month.addEventListener("change", () => month.value && load());
  account.select.addEventListener("change", () => load());
  exportButton.addEventListener("click", async () => {
    alert.hidden = true;
    try {
      // Fetched with the key (never a link carrying it), then saved from the page.
      const csv = await client.requestText("GET", `/v1/admin/usage?${query("csv")}`);
      download(`usage-${month.value}.csv`, csv, "text/csv");
    } catch (error) {
      alert.textContent = describeError(error);
      alert.hidden = false;
    }
  });
  await load();
}
