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

  // Only the toggle writes the mode into the URL. At mount the hash may already name another
  // view (a link clicked while this one loaded, its hashchange not yet handled): rewriting it
  // then would send the user back here instead of where they went.
  function show(mode, { intoUrl = true } = {}) {
    closePopover();
    const comparing = mode === "compare";
    singleButton.setAttribute("aria-pressed", String(!comparing));
    compareButton.setAttribute("aria-pressed", String(comparing));
    singlePane.hidden = comparing;
    comparePane.hidden = !comparing;
    const hash = comparing ? COMPARE_HASH : "#/";
    if (intoUrl && location.hash !== hash) history.replaceState(null, "", hash);
  }
  singleButton.addEventListener("click", () => show("single"));
  compareButton.addEventListener("click", () => show("compare"));

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
  show(location.hash === COMPARE_HASH ? "compare" : "single", { intoUrl: false });
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
