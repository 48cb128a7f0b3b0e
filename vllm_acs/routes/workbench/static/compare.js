// Compare: one shared prompt, up to 6 lanes, each with its own model and full sampler. Run all
// starts every lane, a lane's Run only that one, Stop all cancels every run in flight; each lane
// streams on its own (a slow or cold lane holds up no other) and says "warming up" while its
// model is not warm. Every Run all is saved on the server once its lanes have ended (the newest
// 20 are kept) and Restore brings back the prompt, the lanes and every output (history.js).

import { describeError } from "./api.js";
import { el, formatTime } from "./dom.js";
import { heatLegend } from "./heatmap.js";
import * as history from "./history.js";
import { historyRow } from "./history_row.js";
import { createOutput, toggleButton } from "./output.js";
import { startRun } from "./run.js";
import { createSampler, describeConfig, modelPicker, shortModelId } from "./sampler.js";

export const MAX_LANES = 6;
const START_LANES = 2;

export function createCompare(context, modelStatus) {
  const { client, models } = context;
  const maxLogprobs = models[0]?.capabilities?.max_logprobs ?? 20;
  const prompt = el("textarea", {
    id: "compare-prompt",
    class: "mono prompt",
    rows: 4,
    spellcheck: "false",
    placeholder: "One prompt, shared by every lane.",
  });
  const lanesBox = el("div", { class: "lanes" });
  const notice = el("p", { class: "hint", role: "status" });
  const historyList = el("ul", { class: "entries", "aria-labelledby": "compare-history-title" });
  const addButton = el("button", { type: "button", onclick: () => addLane() }, "Add lane");
  const runAllButton = el("button", { type: "button", class: "primary", onclick: () => runAll() }, "Run all");
  const stopAllButton = el("button", { type: "button", class: "danger", disabled: true, onclick: () => stopAll() }, "Stop all");
  const lanes = [];
  let serial = 0; // lane ids stay unique when lanes come and go
  // The saved snapshot the lanes show (a per-lane Run updates it), and what the next save does.
  let snapshot = null; // {id, prompt}
  let pendingSave = null; // null | "new" | "replace"

  const element = el(
    "div",
    { class: "compare" },
    el(
      "section",
      { class: "card compare-composer" },
      el("label", { for: "compare-prompt" }, "Prompt"),
      prompt,
      el("div", { class: "actions" }, runAllButton, stopAllButton, addButton, el("span", { class: "spacer" }), heatLegend()),
      notice
    ),
    lanesBox,
    el(
      "section",
      { class: "history card", "aria-labelledby": "compare-history-title" },
      el("h2", { id: "compare-history-title" }, "Compare history"),
      el("p", { class: "hint" }, "Every Run all is kept here once its lanes end; the newest 20 stay."),
      historyList
    )
  );

  function createLane(config, heatmap = false, run = null) {
    const number = ++serial;
    const prefix = `lane-${number}`;
    const title = el("h3", { id: `${prefix}-title` }, "Lane");
    const model = modelPicker(models, `${prefix}-model`, (id) => {
      modelStatus.check(id);
      lane.output.setWarming(modelStatus.warm(id) === false);
    });
    const sampler = createSampler(prefix, { maxLogprobs });
    const summary = el("summary", {}, "Sampling");
    const outputName = el("span", { id: `${prefix}-output-name`, class: "visually-hidden" }, "Output");
    const output = createOutput(`${prefix}-output-name`);
    const runButton = el("button", { type: "button", class: "primary", onclick: () => runLane(lane, "one") }, "Run");
    const stopButton = el("button", { type: "button", class: "danger", disabled: true, onclick: () => lane.handle?.stop() }, "Stop");
    const duplicateButton = el("button", { type: "button", onclick: () => duplicate(lane) }, "Duplicate");
    const removeButton = el("button", { type: "button", class: "quiet", onclick: () => removeLane(lane) }, "Remove");
    const heatmapButton = toggleButton("Heatmap", heatmap, (on) => {
      lane.heatmap = on;
      output.show(lane.run, on);
    });
    const element = el(
      "section",
      { class: "lane card", "aria-labelledby": `${prefix}-title` },
      el("div", { class: "lane-head" }, title, el("span", { class: "spacer" }), runButton, stopButton, duplicateButton, removeButton),
      el("div", { class: "lane-tools" }, el("div", { class: "field model-field" }, el("label", { for: `${prefix}-model` }, "Model"), model), el("span", { class: "spacer" }), heatmapButton),
      el("details", { class: "lane-sampler" }, summary, sampler.element),
      outputName,
      output.element
    );
    const lane = {
      element,
      title,
      outputName,
      model,
      sampler,
      summary,
      output,
      runButton,
      stopButton,
      duplicateButton,
      removeButton,
      heatmap,
      run,
      handle: null,
      frame: 0,
      config: () => ({ ...sampler.read(), model: model.value }),
    };
    sampler.set(config);
    model.value = shortModelId(models, config.model);
    element.addEventListener("input", () => (summary.textContent = `Sampling · ${describeConfig(lane.config())}`));
    summary.textContent = `Sampling · ${describeConfig(lane.config())}`;
    output.show(run, heatmap);
    output.setWarming(modelStatus.warm(model.value) === false);
    return lane;
  }

  /** Puts the lanes in the page, numbered (after a lane came or went). */
  function layout() {
    lanes.forEach((lane, i) => {
      lane.title.textContent = `Lane ${i + 1}`;
      lane.outputName.textContent = `Output of lane ${i + 1}`;
    });
    lanesBox.replaceChildren(...lanes.map((lane) => lane.element));
    enableButtons();
  }

  /** Which buttons can act now (the DOM stays put, so focus stays where it is). */
  function enableButtons() {
    const full = lanes.length >= MAX_LANES;
    addButton.disabled = full;
    for (const lane of lanes) {
      lane.duplicateButton.disabled = full;
      lane.removeButton.disabled = lanes.length <= 1 || Boolean(lane.handle);
    }
    const running = lanes.some((lane) => lane.handle);
    stopAllButton.disabled = !running;
    runAllButton.disabled = running;
  }

  function addLane(config = { model: models[0]?.id ?? null }, at = lanes.length, heatmap = false) {
    if (lanes.length >= MAX_LANES) return null;
    const lane = createLane(config, heatmap);
    lanes.splice(at, 0, lane);
    layout();
    return lane;
  }

  function duplicate(lane) {
    const copy = addLane(lane.config(), lanes.indexOf(lane) + 1, lane.heatmap);
    copy?.model.focus();
  }

  function removeLane(lane) {
    if (lanes.length <= 1 || lane.handle) return;
    lanes.splice(lanes.indexOf(lane), 1);
    layout();
  }

  function setLaneRunning(lane, running) {
    const [from, to] = running ? [lane.runButton, lane.stopButton] : [lane.stopButton, lane.runButton];
    const follow = document.activeElement === from;
    lane.runButton.disabled = running;
    lane.stopButton.disabled = !running;
    lane.model.disabled = running;
    lane.sampler.setDisabled(running);
    if (follow) to.focus({ preventScroll: true });
  }

  /** Whether the lane's sampler is within bounds; if not, opens it at the field to fix. */
  function samplerValid(lane) {
    if (lane.sampler.check()) return true;
    lane.element.querySelector("details").open = true;
    lane.sampler.check();
    return false;
  }

  async function runLane(lane, how) {
    if (lane.handle) return;
    if (!samplerValid(lane)) return;
    const text = prompt.value;
    if (!text) {
      notice.textContent = "Type a prompt first.";
      prompt.focus();
      return;
    }
    if (how === "one") {
      // A lane run alone updates the snapshot the lanes came from, if the prompt is still its.
      if (pendingSave !== "new") pendingSave = snapshot && snapshot.prompt === text ? "replace" : null;
      if (!pendingSave) snapshot = null;
    }
    lane.handle = startRun(client, text, lane.config(), {
      onUpdate: (run) => {
        if (lane.frame) return;
        lane.frame = requestAnimationFrame(() => {
          lane.frame = 0;
          lane.output.show(run, lane.heatmap);
        });
      },
    });
    lane.run = lane.handle.run;
    setLaneRunning(lane, true);
    lane.output.show(lane.run, lane.heatmap);
    enableButtons();
    await lane.handle.result;
    cancelAnimationFrame(lane.frame);
    lane.frame = 0;
    lane.handle = null;
    setLaneRunning(lane, false);
    lane.output.show(lane.run, lane.heatmap);
    enableButtons();
    if (!lanes.some((l) => l.handle)) await saveSnapshot(text);
  }

  function runAll() {
    if (lanes.some((lane) => lane.handle)) return;
    if (!prompt.value) {
      notice.textContent = "Type a prompt first.";
      prompt.focus();
      return;
    }
    if (!lanes.every(samplerValid)) return;
    notice.textContent = "";
    pendingSave = "new";
    for (const lane of lanes) runLane(lane, "all");
  }

  function stopAll() {
    for (const lane of lanes) lane.handle?.stop();
  }

  async function saveSnapshot(text) {
    const how = pendingSave;
    pendingSave = null;
    if (!how) return;
    const saved = lanes.map((lane) => ({ config: lane.config(), heatmap: lane.heatmap, run: lane.run }));
    let found = null; // the listing prune read, shown as it is
    try {
      const loom = await history.save(client, history.KINDS.compare, history.promptLabel(text), text, saved);
      if (how === "replace" && snapshot) await history.remove(client, snapshot.id);
      snapshot = { id: loom.id, prompt: text };
      found = await history.prune(client, history.KINDS.compare, history.KEEP.compare);
      notice.textContent = `Saved in the Compare history (${formatTime(loom.created_at)}).`;
    } catch (error) {
      notice.textContent = `Not saved on the server: ${describeError(error)}`;
    }
    await refresh(found);
  }

  async function restore(entry) {
    if (lanes.some((lane) => lane.handle)) {
      notice.textContent = "Stop the lanes before restoring a run.";
      return;
    }
    try {
      const loaded = await history.load(client, entry.id);
      prompt.value = loaded.prompt;
      lanes.splice(0, lanes.length, ...loaded.lanes.slice(0, MAX_LANES).map((l) => createLane(l.config, l.heatmap, l.run)));
      layout();
      snapshot = { id: loaded.id, prompt: loaded.prompt };
      notice.textContent = `Restored the run of ${formatTime(entry.created_at)}: ${loaded.lanes.length} lanes.`;
      modelStatus.check(lanes[0]?.model.value);
    } catch (error) {
      notice.textContent = describeError(error);
    }
  }

  async function showChips(entry, box) {
    if (box.dataset.loaded) return;
    box.dataset.loaded = "1";
    try {
      const loaded = await history.load(client, entry.id);
      box.replaceChildren(
        ...loaded.lanes.map((lane, i) =>
          el("li", { class: `chip state-${lane.run?.state ?? "idle"}` }, `${i + 1}. ${lane.config.model} · ${describeConfig(lane.config)} · ${lane.run?.state ?? "not run"}`)
        )
      );
    } catch (error) {
      box.replaceChildren(el("li", { class: "error" }, describeError(error)));
    }
  }

  /** Lists the Compare history again (`found`: a listAll the caller just made). */
  async function refresh(found = null) {
    let entries;
    try {
      entries = found ? found.compare : await history.list(client, history.KINDS.compare);
    } catch (error) {
      notice.textContent = `History could not be read: ${describeError(error)}`;
      return;
    }
    historyList.replaceChildren(
      ...(entries.length
        ? entries.map((entry) => {
            const chips = el("ul", { class: "chips" }, el("li", { class: "hint" }, "Loading…"));
            const details = el("details", {}, el("summary", {}, `${entry.node_count - 1} lanes`), chips);
            details.addEventListener("toggle", () => details.open && showChips(entry, chips));
            const restoreButton = el("button", { type: "button", onclick: () => restore(entry) }, "Restore");
            return historyRow(entry, restoreButton, details);
          })
        : [el("li", { class: "empty" }, "No Compare runs yet: each Run all is kept here.")])
    );
  }

  modelStatus.listen((id, warm) => {
    for (const lane of lanes) if (lane.model.value === id) lane.output.setWarming(warm === false);
  });
  for (let i = 0; i < START_LANES; i++) addLane();

  return {
    element,
    refresh,
    models: () => lanes.map((lane) => lane.model.value),
    stop: stopAll,
  };
}
