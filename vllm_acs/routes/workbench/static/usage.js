// Usage (#/usage): the signed-in key's budget meters (spent, held by requests in flight,
// remaining, resets at), refreshed every few seconds while the page is open, its traffic now,
// and a chart of this month's tokens per UTC day, one series per model, drawn here as SVG.
// Download CSV saves those per-day rows, in the columns of the console's export (GET
// /v1/admin/usage?format=csv) that a key's own usage has.

import { describeError } from "./api.js";
import { el, formatTime } from "./dom.js";
import { download } from "./loom-files.js";

const REFRESH_MS = 5000;
const NUMBER = new Intl.NumberFormat();
const SVG = "http://www.w3.org/2000/svg";
// Distinct on white and for common colour blindness (Okabe-Ito).
const COLOURS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000"];
const BUDGET_NAMES = {
  key_monthly: "Monthly tokens (this key)",
  key_daily: "Daily tokens (this key)",
  key_monthly_input: "Monthly input tokens (this key)",
  key_monthly_output: "Monthly output tokens (this key)",
  account_monthly: "Monthly tokens (whole account)",
  key_monthly_activations: "Activation requests this month",
};

function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function unitText(budget, value) {
  return `${NUMBER.format(value)} ${budget.unit === "requests" ? "requests" : "tokens"}`;
}

function meter(budget) {
  const label = BUDGET_NAMES[budget.name] ?? budget.name;
  const id = `meter-${budget.name}`;
  const resets = `resets ${formatTime(budget.resets_at)}`;
  if (budget.limit === null) {
    return el(
      "div",
      { class: "meter-row uncapped" },
      el("div", { class: "meter-label" }, el("span", { id }, label), el("span", { class: "hint" }, "no cap")),
      el("p", { class: "meter-text" }, `${unitText(budget, budget.spent)} spent · ${resets}`),
    );
  }
  const held = budget.held ?? 0;
  const share = (value) => `${Math.min(100, (100 * value) / Math.max(1, budget.limit)).toFixed(2)}%`;
  const spentBar = el("span", { class: "bar-spent" });
  const heldBar = el("span", { class: "bar-held" });
  spentBar.style.setProperty("width", share(budget.spent));
  heldBar.style.setProperty("width", share(held));
  const text = `${unitText(budget, budget.spent)} spent, ${NUMBER.format(held)} held, ${NUMBER.format(budget.remaining)} remaining of ${NUMBER.format(budget.limit)}`;
  return el(
    "div",
    { class: "meter-row", dataset: { budget: budget.name } },
    el("div", { class: "meter-label" }, el("span", { id }, label), el("span", { class: "hint" }, resets)),
    el(
      "div",
      {
        class: "meter",
        role: "meter",
        "aria-labelledby": id,
        "aria-valuemin": 0,
        "aria-valuemax": budget.limit,
        "aria-valuenow": Math.min(budget.limit, budget.spent + held),
        "aria-valuetext": text,
      },
      spentBar,
      heldBar,
    ),
    el("p", { class: "meter-text" }, text),
  );
}

function daysOfMonth(period) {
  const [year, month] = period.split("-").map(Number);
  const count = new Date(Date.UTC(year, month, 0)).getUTCDate();
  return Array.from({ length: count }, (_, i) => `${period}-${String(i + 1).padStart(2, "0")}`);
}

function niceMax(value) {
  if (value <= 10) return 10;
  const power = 10 ** Math.floor(Math.log10(value));
  const step = [1, 2, 2.5, 5, 10].find((s) => s * power >= value / 1) ?? 10;
  return step * power;
}

// The chart is drawn at its box's width in CSS pixels (its text stays 13 px and its height stays
// put on a wide screen), never narrower than this: a narrower box scales it down.
const CHART_MIN_WIDTH = 480;
const CHART_FALLBACK_WIDTH = 760; // a box not laid out yet

/** This month's tokens per UTC day: one bar per day, stacked by model (one colour each). */
function chart(usage, boxWidth) {
  const days = daysOfMonth(usage.period);
  const models = [...new Set(usage.days.map((d) => d.model ?? "(none)"))].sort();
  const perDay = new Map(); // date -> Map(model -> tokens)
  for (const d of usage.days) {
    const model = d.model ?? "(none)";
    if (!perDay.has(d.date)) perDay.set(d.date, new Map());
    const day = perDay.get(d.date);
    day.set(model, (day.get(model) ?? 0) + d.prompt_tokens + d.completion_tokens);
  }
  const dayTotal = (date) => [...(perDay.get(date)?.values() ?? [])].reduce((a, b) => a + b, 0);
  const top = niceMax(Math.max(0, ...days.map(dayTotal)));
  const width = Math.max(CHART_MIN_WIDTH, Math.round(boxWidth) || CHART_FALLBACK_WIDTH);
  const [height, left, right, topPad, bottom] = [270, 64, 12, 14, 48];
  const slot = (width - left - right) / days.length;
  const x = (i) => left + slot * i;
  const y = (v) => topPad + (height - topPad - bottom) * (1 - v / top);
  const modelTotal = (model) => [...perDay.values()].reduce((sum, day) => sum + (day.get(model) ?? 0), 0);
  const summary = models.length
    ? `Tokens per day in ${usage.period}: ${models.map((m) => `${m} ${NUMBER.format(modelTotal(m))}`).join(", ")}`
    : `No tokens used in ${usage.period} yet`;
  const graph = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": summary });
  graph.append(svg("title", {}, summary));
  for (let i = 0; i <= 4; i++) {
    const value = (top * i) / 4;
    graph.append(
      svg("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: "grid" }),
      svg("text", { x: left - 8, y: y(value) + 4, class: "axis", "text-anchor": "end" }, NUMBER.format(value)),
    );
  }
  days.forEach((date, i) => {
    let base = 0;
    models.forEach((model, m) => {
      const value = perDay.get(date)?.get(model) ?? 0;
      if (!value) return;
      const bar = svg(
        "rect",
        { x: x(i) + slot * 0.15, width: slot * 0.7, y: y(base + value), height: Math.max(1, y(base) - y(base + value)), fill: COLOURS[m % COLOURS.length] },
        svg("title", {}, `${model}, ${date}: ${NUMBER.format(value)} tokens`),
      );
      graph.append(bar);
      base += value;
    });
    if (i % 5 === 0 || i === days.length - 1) {
      graph.append(svg("text", { x: x(i) + slot / 2, y: height - bottom + 18, class: "axis", "text-anchor": "middle" }, String(i + 1)));
    }
  });
  graph.append(
    svg("text", { x: left + (width - left - right) / 2, y: height - 6, class: "axis", "text-anchor": "middle" }, "Day of the month (UTC)"),
  );
  const legend = el(
    "ul",
    { class: "chart-legend", "aria-label": "Models" },
    models.map((model, m) => {
      const swatch = el("span", { class: "swatch" });
      swatch.style.setProperty("background", COLOURS[m % COLOURS.length]);
      return el("li", {}, swatch, model);
    }),
  );
  return el("figure", { class: "chart-figure" }, graph, legend);
}

function dayTable(usage) {
  const rows = usage.days.map((d) =>
    el(
      "tr",
      {},
      el("td", {}, d.date),
      el("td", {}, d.model ?? "(none)"),
      el("td", { class: "num" }, NUMBER.format(d.prompt_tokens)),
      el("td", { class: "num" }, NUMBER.format(d.completion_tokens)),
      el("td", { class: "num" }, NUMBER.format(d.requests)),
    ),
  );
  const total = usage.models.reduce((sum, m) => sum + m.total_tokens, 0);
  return el(
    "table",
    { class: "usage-table" },
    el("caption", {}, `Tokens per day and model: ${NUMBER.format(total)} this month`),
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        el("th", { scope: "col" }, "Day (UTC)"),
        el("th", { scope: "col" }, "Model"),
        ["Prompt tokens", "Completion tokens", "Requests"].map((h) => el("th", { scope: "col", class: "num" }, h)),
      ),
    ),
    el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 5 }, "No requests this month yet."))),
  );
}

const CSV_COLUMNS = ["date", "model", "requests", "prompt_tokens", "completion_tokens", "activation_requests"];

function csvField(value) {
  const text = value === null || value === undefined ? "" : String(value);
  return /[",\n\r]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

/** This month's per-day rows as CSV: a header line, then one line per day and model. */
export function usageCsv(usage) {
  const lines = [CSV_COLUMNS.join(",")];
  for (const day of usage.days) lines.push(CSV_COLUMNS.map((column) => csvField(day[column])).join(","));
  return `${lines.join("\n")}\n`;
}

function traffic(usage) {
  const t = usage.traffic;
  return el(
    "dl",
    { class: "account-facts traffic" },
    el("dt", {}, "Running"),
    el("dd", {}, `${t.running} of ${t.max_running}`),
    el("dt", {}, "Waiting"),
    el("dd", {}, `${t.waiting} of ${t.max_waiting}`),
    el("dt", {}, "Starts in the last minute"),
    el("dd", {}, `${t.starts_last_minute} of ${t.starts_per_minute}`),
  );
}

export function mount(main, context) {
  const { client } = context;
  const alert = el("p", { class: "error", role: "alert", hidden: true });
  const updated = el("span", { class: "hint", role: "status" });
  const refresh = el("button", { type: "button", onclick: () => load() }, "Refresh");
  const exportButton = el("button", { type: "button", disabled: true }, "Download CSV");
  exportButton.addEventListener("click", () => shown && download(`usage-${shown.period}.csv`, usageCsv(shown), "text/csv"));
  const meters = el("div", { class: "meters" });
  const trafficBox = el("div");
  const chartBox = el("div");
  const tableBox = el("div", { class: "table-scroll" });
  main.replaceChildren(
    el(
      "div",
      { class: "account-page" },
      el("div", { class: "page-head" }, el("h1", {}, "Usage"), refresh, exportButton, updated),
      alert,
      el(
        "div",
        { class: "usage-grid" },
        el("section", { class: "card", "aria-labelledby": "budgets-title" }, el("h2", { id: "budgets-title" }, "Budgets"), meters),
        el("section", { class: "card", "aria-labelledby": "traffic-title" }, el("h2", { id: "traffic-title" }, "Traffic now"), trafficBox),
      ),
      el(
        "section",
        { class: "card", "aria-labelledby": "chart-title" },
        el("h2", { id: "chart-title" }, "This month's tokens per day"),
        chartBox,
        tableBox,
      ),
    ),
  );

  let stopped = false;
  let timer = null;
  let shown = null; // the usage the chart shows: redrawn when its box changes width
  let drawnWidth = 0;
  function drawChart() {
    drawnWidth = chartBox.clientWidth;
    chartBox.replaceChildren(chart(shown, drawnWidth));
  }
  const resized = new ResizeObserver(() => {
    if (shown && Math.abs(chartBox.clientWidth - drawnWidth) > 8) drawChart();
  });
  resized.observe(chartBox);
  async function load() {
    clearTimeout(timer);
    try {
      const usage = await client.request("GET", "/v1/usage");
      if (stopped) return;
      alert.hidden = true;
      meters.replaceChildren(...usage.budgets.map(meter), meter(usage.activation_requests));
      trafficBox.replaceChildren(traffic(usage));
      shown = usage;
      exportButton.disabled = false;
      drawChart();
      tableBox.replaceChildren(dayTable(usage));
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      if (stopped) return;
      alert.textContent = describeError(error);
      alert.hidden = false;
    }
    if (!stopped) timer = setTimeout(load, REFRESH_MS);
  }
  load();
  return {
    unmount() {
      stopped = true;
      clearTimeout(timer);
      resized.disconnect();
    },
  };
}
