// Tokens coloured by their logprob (green confident, red surprising), each a button that shows
// its top alternatives on hover, focus or click. One ramp for the single pane, Compare and Loom.
//
// A token here is {text, logprob, alternatives: [{text, logprob}]} (logprob null when unknown);
// fromCompletionLogprobs and fromLoomTokens make them from the API's two shapes.

import { el } from "./dom.js";

/** The tokens of a completion choice's `logprobs` ({tokens, token_logprobs, top_logprobs}). */
export function fromCompletionLogprobs(logprobs) {
  if (!logprobs?.tokens) return [];
  return logprobs.tokens.map((text, i) => ({
    text,
    logprob: logprobs.token_logprobs?.[i] ?? null,
    alternatives: Object.entries(logprobs.top_logprobs?.[i] ?? {})
      .map(([alternative, logprob]) => ({ text: alternative, logprob }))
      .sort((a, b) => b.logprob - a.logprob),
  }));
}

/** The tokens of a Loom Node (`tokens` or `score.tokens`: {text, logprob, top_logprobs}). */
export function fromLoomTokens(tokens) {
  return (tokens ?? []).map((token) => ({
    text: token.text ?? "",
    logprob: token.logprob ?? null,
    alternatives: (token.top_logprobs ?? []).map((a) => ({ text: a.text, logprob: a.logprob })),
  }));
}

/** The background of a token of this logprob: hue 0 (red) at p=0 to 120 (green) at p=1. */
export function heatColour(logprob) {
  if (logprob === null || logprob === undefined || Number.isNaN(logprob)) return null;
  const p = Math.min(1, Math.max(0, Math.exp(logprob)));
  return `hsl(${Math.round(120 * p)} 70% 84%)`;
}

export function percent(logprob) {
  const p = Math.exp(logprob) * 100;
  return p >= 10 ? `${p.toFixed(0)}%` : p >= 0.1 ? `${p.toFixed(1)}%` : `${p.toExponential(0)}`;
}

/** Makes the visible whitespace of a token readable in a list (a space, a newline). */
export function showToken(text) {
  if (text === "") return "∅";
  return text.replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/^ | $/g, "·");
}

let popover = null;
let popoverOwner = null;
let pinned = false; // opened by a click (stays) rather than a hover (goes with the pointer)

/** Closes the popover of top alternatives, if one is open (a view that hides its tokens). */
export function closePopover() {
  if (popover) popover.hidden = true;
  popoverOwner?.setAttribute("aria-expanded", "false");
  popoverOwner = null;
  pinned = false;
}

function openPopover(button, token, pin) {
  if (!popover) {
    popover = el("div", { class: "token-popover", role: "dialog", "aria-label": "Top alternatives", hidden: true });
    document.body.append(popover);
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && popoverOwner) {
        const owner = popoverOwner;
        closePopover();
        owner.focus();
      }
    });
  }
  popoverOwner?.setAttribute("aria-expanded", "false");
  popoverOwner = button;
  pinned = pin;
  button.setAttribute("aria-expanded", "true");
  const rows = token.alternatives.map((a) =>
    el(
      "tr",
      { class: a.text === token.text ? "chosen" : null },
      el("td", { class: "alt-token" }, showToken(a.text)),
      el("td", { class: "alt-prob" }, percent(a.logprob)),
      el("td", { class: "alt-logprob" }, a.logprob.toFixed(3))
    )
  );
  popover.replaceChildren(
    el(
      "p",
      { class: "popover-title" },
      el("code", {}, showToken(token.text)),
      token.logprob === null ? " (no logprob)" : ` ${percent(token.logprob)} · logprob ${token.logprob.toFixed(3)}`
    ),
    rows.length
      ? el("table", {}, el("caption", {}, "Top alternatives"), el("tbody", {}, rows))
      : el("p", { class: "hint" }, "No alternatives were recorded (ask for logprobs).")
  );
  popover.hidden = false;
  const box = button.getBoundingClientRect();
  const top = box.bottom + window.scrollY + 6;
  const left = Math.min(box.left + window.scrollX, window.scrollX + document.documentElement.clientWidth - popover.offsetWidth - 8);
  popover.style.top = `${top}px`;
  popover.style.left = `${Math.max(8, left)}px`;
}

/**
 * The tokens as inline buttons inside `container` (replacing its children). With heatmap off,
 * the text reads plainly but a click still shows the alternatives.
 */
export function renderTokens(container, tokens, { heatmap = true } = {}) {
  if (popoverOwner && container.contains(popoverOwner)) closePopover(); // its token goes
  container.classList.toggle("heatmap-on", heatmap);
  container.replaceChildren(
    ...tokens.map((token) => {
      const label = token.logprob === null ? token.text : `${token.text} (${percent(token.logprob)})`;
      const button = el(
        "button",
        {
          type: "button",
          class: "tok",
          "aria-label": label,
          "aria-haspopup": "dialog",
          "aria-expanded": "false",
          title: token.logprob === null ? null : `logprob ${token.logprob.toFixed(3)}`,
        },
        token.text
      );
      const colour = heatColour(token.logprob);
      if (colour) button.style.setProperty("--heat", colour);
      // A click pins the popover (a hover opened it already) and a second click closes it.
      button.addEventListener("click", () => {
        if (popoverOwner === button && pinned) closePopover();
        else openPopover(button, token, true);
      });
      button.addEventListener("mouseenter", () => !pinned && openPopover(button, token, false));
      button.addEventListener("mouseleave", () => popoverOwner === button && !pinned && closePopover());
      return button;
    })
  );
}

/** A one-line legend of the ramp. */
export function heatLegend() {
  return el(
    "span",
    { class: "heat-legend", "aria-hidden": "true" },
    el("span", { class: "swatch sure" }),
    "confident",
    el("span", { class: "swatch unsure" }),
    "surprising"
  );
}
