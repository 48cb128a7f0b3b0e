// The branch controls (full-docs "2. Branch"): model, n, max tokens, temperature, logprobs and
// seed (`auto`, or a number pinned), and **Branch from here**. One click sends one streamed
// request for n completions; the page adds the children as `started` names them and grows
// their text with each `delta`. The settings but the seed are remembered in localStorage (a
// pinned seed is for one reproduction, not for every later branch).

import { el } from "./dom.js";

const SETTINGS_KEY = "vllm-acs.loom.branch";
const DEFAULTS = { n: 2, max_tokens: 32, temperature: 1, logprobs: 5 };
// The API takes seeds up to 2^63 - 1; a JSON number from the page is exact up to 2^53 - 1.
export const SEED_MAX = Number.MAX_SAFE_INTEGER;

function numberField(id, label, value, { min, max, step = "1" }) {
  const input = el("input", { id, type: "number", min: String(min), max: max === undefined ? null : String(max), step, value: String(value), required: true });
  return { input, field: el("div", { class: "field" }, el("label", { for: id }, label), input) };
}

function remembered() {
  try {
    return { ...DEFAULTS, ...JSON.parse(localStorage.getItem(SETTINGS_KEY) ?? "{}") };
  } catch {
    return { ...DEFAULTS };
  }
}

/** The seed field's value read: null for auto, a whole number, or an Error saying what is wrong. */
export function parseSeed(text) {
  const value = text.trim().toLowerCase();
  if (value === "" || value === "auto") return null;
  if (!/^\d+$/.test(value) || Number(value) > SEED_MAX) return new Error(`Seed must be auto or a whole number from 0 to ${SEED_MAX}.`);
  return Number(value);
}

export function createBranchControls({ models, onBranch }) {
  const saved = remembered();
  const maxLogprobs = models[0]?.capabilities?.max_logprobs ?? 20;
  const model = el(
    "select",
    { id: "branch-model" },
    models.map((m) => el("option", { value: m.id }, m.default ? `${m.id} (default)` : m.id))
  );
  if (models.some((m) => m.id === saved.model)) model.value = saved.model;
  const n = numberField("branch-n", "n", saved.n, { min: 1, max: 16 });
  const maxTokens = numberField("branch-max-tokens", "Max tokens", saved.max_tokens, { min: 1 });
  const temperature = numberField("branch-temperature", "Temperature", saved.temperature, { min: 0, max: 100, step: "0.05" });
  const logprobs = numberField("branch-logprobs", "Logprobs", saved.logprobs, { min: 0, max: maxLogprobs });
  const seed = el("input", { id: "branch-seed", type: "text", inputmode: "numeric", value: "auto", autocomplete: "off", spellcheck: "false", "aria-describedby": "branch-seed-hint" });
  const button = el("button", { type: "submit", class: "primary" }, "Branch from here");
  const problem = el("p", { class: "error", role: "alert", hidden: true });

  const form = el(
    "form",
    { class: "branch-form", "aria-labelledby": "branch-title", novalidate: true },
    el("h2", { id: "branch-title" }, "Branch"),
    el("div", { class: "field wide" }, el("label", { for: "branch-model" }, "Model"), model),
    el("div", { class: "branch-grid" }, n.field, maxTokens.field, temperature.field, logprobs.field),
    el(
      "div",
      { class: "field wide" },
      el("label", { for: "branch-seed" }, "Seed"),
      seed,
      el("span", { class: "hint", id: "branch-seed-hint" }, "auto samples afresh; a number pins it (child i gets seed + i)")
    ),
    problem,
    el("div", { class: "branch-go" }, button, el("span", { class: "hint" }, el("kbd", {}, "g")))
  );

  /** The branch body, or null after showing what is wrong with a field. */
  function body() {
    problem.hidden = true;
    const fields = [n.input, maxTokens.input, temperature.input, logprobs.input];
    const bad = fields.find((input) => !input.checkValidity() || input.value === "");
    if (bad) {
      const label = form.querySelector(`label[for="${bad.id}"]`).textContent;
      problem.textContent = `${label}: ${bad.validationMessage || "a number is needed"}`;
      problem.hidden = false;
      bad.focus();
      return null;
    }
    const pinned = parseSeed(seed.value);
    if (pinned instanceof Error) {
      problem.textContent = pinned.message;
      problem.hidden = false;
      seed.focus();
      return null;
    }
    const settings = {
      model: model.value,
      n: Number(n.input.value),
      max_tokens: Number(maxTokens.input.value),
      temperature: Number(temperature.input.value),
      logprobs: Number(logprobs.input.value),
    };
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
    return pinned === null ? settings : { ...settings, seed: pinned };
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    onBranch();
  });

  function busy(running) {
    button.disabled = running;
    button.textContent = running ? "Branching…" : "Branch from here";
  }

  return { element: form, body, busy, button, logprobs: () => Number(logprobs.input.value) || 0, model: () => model.value };
}
