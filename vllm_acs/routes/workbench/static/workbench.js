// The Workbench view (#/ and #/compare): the single pane, or Compare behind the Single / Compare
// toggle. Both panes stay mounted while the view is, so switching keeps what each holds; the
// mode is in the hash (#/compare), so a reload comes back to it.

import { el } from "./dom.js";
import { createCompare } from "./compare.js";
import { listAll } from "./history.js";
import { closePopover } from "./heatmap.js";
import { createModelStatus } from "./model_status.js";
import { createSingle } from "./single.js";

const COMPARE_HASH = "#/compare";

export function mount(main, context) {
  const modelStatus = createModelStatus(context.client);
  const single = createSingle(context, modelStatus);
  const compare = createCompare(context, modelStatus);
  const singleButton = el("button", { type: "button", class: "segment" }, "Single");
  const compareButton = el("button", { type: "button", class: "segment" }, "Compare");
  const singlePane = el("div", { class: "pane", id: "single-pane", role: "region", "aria-label": "Single" }, single.element);
  const comparePane = el("div", { class: "pane", id: "compare-pane", role: "region", "aria-label": "Compare" }, compare.element);

  function show(mode) {
    closePopover();
    const comparing = mode === "compare";
    singleButton.setAttribute("aria-pressed", String(!comparing));
    compareButton.setAttribute("aria-pressed", String(comparing));
    singlePane.hidden = comparing;
    comparePane.hidden = !comparing;
  }
  // Only the toggle writes the mode into the URL, never the mount: by then the hash may already
  // name another view (a link clicked while this one loaded), and rewriting it would send the
  // user back here instead of where they went.
  function choose(mode) {
    show(mode);
    const hash = mode === "compare" ? COMPARE_HASH : "#/";
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }
  singleButton.addEventListener("click", () => choose("single"));
  compareButton.addEventListener("click", () => choose("compare"));

  main.replaceChildren(
    el(
      "div",
      { class: "workbench" },
      el(
        "div",
        { class: "view-head" },
        el("h1", {}, "Workbench"),
        el("div", { class: "segmented", role: "group", "aria-label": "Single / Compare" }, singleButton, compareButton),
        el("p", { class: "hint" }, "Base models continue raw text: no chat template. Runs are tagged interactive and kept on the server for this key.")
      ),
      singlePane,
      comparePane
    )
  );
  show(location.hash === COMPARE_HASH ? "compare" : "single");
  modelStatus.start(() => [...single.models(), ...compare.models()]);
  listAll(context.client).then(
    (found) => {
      single.refresh(found);
      compare.refresh(found);
    },
    () => {
      single.refresh(); // each says what went wrong
      compare.refresh();
    }
  );

  return {
    unmount() {
      closePopover();
      single.stop();
      compare.stop();
      modelStatus.stop();
    },
  };
}
