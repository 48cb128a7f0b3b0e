// The sampling controls of one run (the single pane's, or one Compare lane's), with the spec's
// bounds: max tokens, temperature (a slider to 5 and a number field to 100), top_p, top_k, min_p,
// the three penalties, seed (blank: auto), up to 4 stop strings, and the alternatives per token
// that the heatmap shows. A config is a plain object; `requestFields` turns one into the body of
// a completion.

import { el } from "./dom.js";

export const MAX_STOPS = 4;
export const TEMPERATURE_SLIDER_MAX = 5;
const OUTPUT_CAP = 32_000; // prompt_count × n × max_tokens, with one prompt and n = 1
const SEED_LIMIT = 2 ** 31; // a drawn seed; a typed one may be any safe integer ≥ 0

export const DEFAULT_CONFIG = Object.freeze({
  model: null,
  max_tokens: 64,
  temperature: 1,
  top_p: 1,
  top_k: -1,
  min_p: 0,
  presence_penalty: 0,
  frequency_penalty: 0,
  repetition_penalty: 1,
  seed: null,
  stop: [],
  logprobs: 5,
});

// name, label, bounds, step, hint (the spec's bounds; the node checks them again).
const NUMBER_FIELDS = [
  ["max_tokens", "Max tokens", 1, OUTPUT_CAP, 1, "1 to 32,000"],
  ["top_p", "Top p", 0, 1, "any", "(0, 1]; 1 disables"],
  ["top_k", "Top k", -1, null, 1, "-1 disables"],
  ["min_p", "Min p", 0, 1, "any", "0 to 1; 0 disables"],
  ["presence_penalty", "Presence penalty", -2, 2, "any", "-2 to 2"],
  ["frequency_penalty", "Frequency penalty", -2, 2, "any", "-2 to 2"],
  ["repetition_penalty", "Repetition penalty", 0, 2, "any", "(0, 2]; 1 disables"],
];

/** The model picker: short ids, the default first (the order the context gives). */
export function modelPicker(models, id, onChange) {
  const select = el(
    "select",
    { id, onchange: () => onChange?.(select.value) },
    models.map((m) => el("option", { value: m.id }, m.default ? `${m.id} (default)` : m.id))
  );
  return select;
}

export function shortModelId(models, wanted) {
  return models.some((m) => m.id === wanted) ? wanted : models[0]?.id ?? null;
}

function numberInput(id, min, max, step) {
  return el("input", {
    id,
    type: "number",
    inputmode: "decimal",
    min: min ?? undefined,
    max: max ?? undefined,
    step,
    required: true,
  });
}

function row(id, label, control, hint) {
  return el(
    "div",
    { class: "field" },
    el("label", { for: id }, label),
    control,
    hint ? el("span", { class: "field-hint", id: `${id}-hint` }, hint) : null
  );
}

/**
 * The controls for one sampler, ids prefixed with `prefix`. Returns {element, read, set, check}:
 * read() -> config without the model, set(config) fills the fields, check() reports the first
 * field out of bounds (and focuses it) and returns whether all are valid.
 */
export function createSampler(prefix, { maxLogprobs = 20 } = {}) {
  const id = (name) => `${prefix}-${name}`;
  const inputs = {};
  const rows = [];
  for (const [name, label, min, max, step, hint] of NUMBER_FIELDS) {
    inputs[name] = numberInput(id(name), min, max, step);
    inputs[name].setAttribute("aria-describedby", `${id(name)}-hint`);
    rows.push(row(id(name), label, inputs[name], hint));
  }

  const slider = el("input", {
    id: id("temperature"),
    type: "range",
    min: 0,
    max: TEMPERATURE_SLIDER_MAX,
    step: 0.05,
  });
  const exact = numberInput(id("temperature-exact"), 0, 100, "any");
  exact.setAttribute("aria-label", "Exact temperature");
  exact.classList.add("temperature-exact");
  slider.addEventListener("input", () => (exact.value = slider.value));
  exact.addEventListener("input", () => {
    const value = Number(exact.value);
    if (exact.value !== "" && Number.isFinite(value)) slider.value = String(Math.min(TEMPERATURE_SLIDER_MAX, value));
  });
  const temperatureRow = el(
    "div",
    { class: "field field-wide" },
    el("label", { for: id("temperature") }, "Temperature"),
    el("div", { class: "temperature" }, slider, exact),
    el("span", { class: "field-hint" }, "0 is greedy; the slider stops at 5, type up to 100")
  );

  const seed = el("input", {
    id: id("seed"),
    type: "number",
    min: 0,
    max: Number.MAX_SAFE_INTEGER, // the API takes up to 2^63 - 1; a page's number stays exact to here
    step: 1,
    placeholder: "auto",
    "aria-describedby": `${id("seed")}-hint`,
  });
  const logprobs = numberInput(id("logprobs"), 0, Math.min(100, maxLogprobs), 1);
  logprobs.setAttribute("aria-describedby", `${id("logprobs")}-hint`);
  const stops = Array.from({ length: MAX_STOPS }, (_, i) =>
    el("input", { id: id(`stop-${i + 1}`), type: "text", "aria-label": `Stop string ${i + 1}`, spellcheck: "false" })
  );

  const element = el(
    "div",
    { class: "sampler" },
    el("div", { class: "field-grid" }, temperatureRow, ...rows,
      row(id("seed"), "Seed", seed, "blank: a new one each run (recorded)"),
      row(id("logprobs"), "Alternatives", logprobs, `per token for the heatmap, 0 to ${Math.min(100, maxLogprobs)}`)),
    el(
      "fieldset",
      { class: "stops" },
      el("legend", {}, "Stop strings (up to 4)"),
      el("div", { class: "stop-inputs" }, stops)
    )
  );

  function set(config) {
    const c = { ...DEFAULT_CONFIG, ...config };
    for (const [name] of NUMBER_FIELDS) inputs[name].value = String(c[name]);
    exact.value = String(c.temperature);
    slider.value = String(Math.min(TEMPERATURE_SLIDER_MAX, c.temperature));
    seed.value = c.seed === null || c.seed === undefined ? "" : String(c.seed);
    logprobs.value = String(c.logprobs);
    stops.forEach((input, i) => (input.value = c.stop?.[i] ?? ""));
  }

  function read() {
    const config = {};
    for (const [name] of NUMBER_FIELDS) config[name] = Number(inputs[name].value);
    config.temperature = Number(exact.value);
    config.seed = seed.value.trim() === "" ? null : Number(seed.value);
    config.logprobs = Number(logprobs.value);
    config.stop = stops.map((s) => s.value).filter((s) => s !== "");
    return config;
  }

  function check() {
    for (const input of [exact, ...Object.values(inputs), seed, logprobs]) {
      if (!input.checkValidity()) {
        input.reportValidity();
        input.focus();
        return false;
      }
    }
    return true;
  }

  function setDisabled(disabled) {
    for (const input of element.querySelectorAll("input")) input.disabled = disabled;
  }

  set(DEFAULT_CONFIG);
  return { element, read, set, check, setDisabled };
}

/** A seed for a run whose seed is auto: drawn here, so every run records the seed it used. */
export function drawSeed() {
  return Math.floor(Math.random() * SEED_LIMIT);
}

/** The completion body of a config (`seed` already drawn), streamed. */
export function requestFields(config, prompt) {
  const body = {
    model: config.model,
    prompt,
    max_tokens: config.max_tokens,
    temperature: config.temperature,
    top_p: config.top_p,
    top_k: config.top_k,
    min_p: config.min_p,
    presence_penalty: config.presence_penalty,
    frequency_penalty: config.frequency_penalty,
    repetition_penalty: config.repetition_penalty,
    seed: config.seed,
    stream: true,
  };
  if (config.stop.length) body.stop = config.stop;
  if (config.logprobs > 0) body.logprobs = config.logprobs;
  return body;
}

/** One line naming what a config changes from the defaults (for history rows and chips). */
export function describeConfig(config) {
  const parts = [`T ${config.temperature}`, `max ${config.max_tokens}`];
  if (config.top_p !== 1) parts.push(`top_p ${config.top_p}`);
  if (config.top_k !== -1) parts.push(`top_k ${config.top_k}`);
  if (config.min_p !== 0) parts.push(`min_p ${config.min_p}`);
  if (config.seed !== null && config.seed !== undefined) parts.push(`seed ${config.seed}`);
  return parts.join(" · ");
}
