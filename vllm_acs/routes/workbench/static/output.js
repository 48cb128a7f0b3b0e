// The output of one run (the single pane's, or a Compare lane's): a status line, the text as it
// streams, its tokens coloured by logprob once the heatmap is on (a click or hover on a token
// shows its top alternatives), what the run recorded, and an error with its code, message and
// X-Request-Id.

import { el } from "./dom.js";
import { closePopover, renderTokens } from "./heatmap.js";

const STATE_LABELS = {
  idle: "Not run yet",
  running: "Running…",
  done: "Done",
  stopped: "Stopped",
  failed: "Failed",
};

function counted(n, noun) {
  return `${n} ${noun}${n === 1 ? "" : "s"}`;
}

function tokenCount(run) {
  return run.tokens.length ? counted(run.tokens.length, "token") : counted(run.text.length, "character");
}

function stateLine(run) {
  if (!run) return STATE_LABELS.idle;
  const label = STATE_LABELS[run.state] ?? run.state;
  if (run.state === "done") return `${label} · ${tokenCount(run)}${run.finishReason ? ` · finish: ${run.finishReason}` : ""}`;
  if (run.state === "stopped") return `${label} after ${tokenCount(run)}`;
  return label;
}

/** Returns {element, show(run, heatmap), setWarming(bool)}; run may be null (nothing yet). */
export function createOutput(labelledBy) {
  const status = el("p", { class: "run-state", role: "status" });
  const warming = el("span", { class: "warming", hidden: true }, "warming up");
  // Focusable: a long output scrolls, and a keyboard must be able to scroll it.
  const body = el("div", { class: "tokens output-text", "aria-labelledby": labelledBy, role: "region", tabindex: "0" });
  const meta = el("p", { class: "run-meta" });
  const error = el("p", { class: "error", role: "alert", hidden: true });
  const element = el("div", { class: "output" }, el("div", { class: "run-status" }, status, warming), body, error, meta);
  let shown = null; // the run whose tokens the body holds

  function show(run, heatmap) {
    status.textContent = stateLine(run);
    element.dataset.state = run ? run.state : "idle";
    if (!run) {
      body.replaceChildren(el("span", { class: "placeholder" }, "The completion appears here."));
      meta.textContent = "";
      error.hidden = true;
      shown = null;
      return;
    }
    if (run.state === "running" || !run.tokens.length || !heatmap) {
      // The text as the model wrote it (a token may be part of a character, so the tokens
      // joined can differ); the tokens once the heatmap is on and the run has ended.
      if (shown) closePopover(); // its token is going
      body.classList.remove("heatmap-on");
      body.replaceChildren(run.text);
      shown = null;
    } else if (shown !== run) {
      renderTokens(body, run.tokens, { heatmap });
      shown = run;
    }
    const parts = [];
    if (run.checkpoint) parts.push(`checkpoint ${run.checkpoint}`);
    if (run.seed !== null && run.seed !== undefined) parts.push(`seed ${run.seed}${run.seedAuto ? " (drawn)" : ""}`);
    // A failed run's alert already names its request.
    if (run.requestId && run.error?.requestId !== run.requestId) parts.push(`request ${run.requestId}`);
    if (heatmap && run.state !== "running" && run.text && !run.tokens.length) {
      parts.push("no logprobs recorded: set Alternatives to 1 or more for the heatmap");
    }
    meta.textContent = parts.join(" · ");
    error.hidden = !run.error;
    error.textContent = run.error ? run.error.describe() : "";
  }

  function setWarming(on) {
    warming.hidden = !on;
  }

  show(null, false);
  return { element, show, setWarming };
}

/** A toggle button (aria-pressed) named `name`. */
export function toggleButton(name, pressed, onToggle, attributes = {}) {
  const button = el("button", { type: "button", class: "toggle", "aria-pressed": String(pressed), ...attributes }, name);
  button.addEventListener("click", () => {
    const now = button.getAttribute("aria-pressed") !== "true";
    button.setAttribute("aria-pressed", String(now));
    onToggle(now);
  });
  return button;
}
