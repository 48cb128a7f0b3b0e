// One row of a history list (saved prompts, past runs, Compare runs): the entry's label and
// time, its buttons, and anything shown under it.

import { el, formatTime } from "./dom.js";

/** entry: a `history.list` entry ({label, created_at}); actions: its buttons; below: more. */
export function historyRow(entry, actions, ...below) {
  return el(
    "li",
    { class: "entry" },
    el(
      "span",
      { class: "entry-main" },
      el("span", { class: "entry-label", title: entry.label }, entry.label),
      el("time", { class: "entry-time", datetime: new Date(entry.created_at * 1000).toISOString() }, formatTime(entry.created_at))
    ),
    el("span", { class: "entry-actions" }, actions),
    ...below
  );
}
