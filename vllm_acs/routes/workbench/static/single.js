// The single pane: a Model, a Prompt, the sampler; Run streams one completion and Stop cancels
// it; Heatmap colours its tokens. Every run is kept on the server as a past run, and a prompt
// can be saved (history.js); both lists are the key's, so another browser finds them.

import { describeError } from "./api.js";
import { el, formatTime } from "./dom.js";
import { heatLegend } from "./heatmap.js";
import * as history from "./history.js";
import { historyRow } from "./history_row.js";
import { createOutput, toggleButton } from "./output.js";
import { startRun } from "./run.js";
import { createSampler, modelPicker, shortModelId } from "./sampler.js";

export function createSingle(context, modelStatus) {
  const { client, models } = context;
  const maxLogprobs = models[0]?.capabilities?.max_logprobs ?? 20;
  const model = modelPicker(models, "single-model", (id) => {
    modelStatus.check(id);
    output.setWarming(modelStatus.warm(id) === false);
  });
  const prompt = el("textarea", {
    id: "single-prompt",
    class: "mono prompt",
    rows: 8,
    spellcheck: "false",
    placeholder: "Raw text the model continues: no chat template is applied.",
  });
  const sampler = createSampler("single", { maxLogprobs });
  const output = createOutput("single-output-title");
  let heatmap = false;
  let current = null; // {run, stop, result}
  let shownRun = null;
  let frame = 0;

  const runButton = el("button", { type: "button", class: "primary", onclick: () => run() }, "Run");
  const stopButton = el("button", { type: "button", class: "danger", disabled: true, onclick: () => current?.stop() }, "Stop");
  const heatmapButton = toggleButton("Heatmap", false, (on) => {
    heatmap = on;
    output.show(shownRun, heatmap);
  });
  const saveButton = el("button", { type: "button", onclick: () => savePrompt() }, "Save prompt");
  const notice = el("p", { class: "hint", role: "status" });

  const savedList = el("ul", { class: "entries", "aria-labelledby": "saved-prompts-title" });
  const runsList = el("ul", { class: "entries", "aria-labelledby": "past-runs-title" });

  const element = el(
    "div",
    { class: "single" },
    el(
      "div",
      { class: "single-main" },
      el(
        "div",
        { class: "composer card" },
        el("div", { class: "field model-field" }, el("label", { for: "single-model" }, "Model"), model),
        el("label", { for: "single-prompt" }, "Prompt"),
        prompt,
        el("div", { class: "actions" }, runButton, stopButton, saveButton, el("span", { class: "spacer" }), heatmapButton, heatLegend()),
        notice,
        el("h2", { id: "single-output-title" }, "Completion"),
        output.element
      ),
      el(
        "div",
        { class: "single-history" },
        el(
          "section",
          { class: "history card", "aria-labelledby": "saved-prompts-title" },
          el("h2", { id: "saved-prompts-title" }, "Saved prompts"),
          savedList
        ),
        el(
          "section",
          { class: "history card", "aria-labelledby": "past-runs-title" },
          el("h2", { id: "past-runs-title" }, "Past runs"),
          runsList
        )
      )
    ),
    el(
      "section",
      { class: "sampler-panel card", "aria-labelledby": "single-sampling-title" },
      el("h2", { id: "single-sampling-title" }, "Sampling"),
      sampler.element
    )
  );

  function config() {
    return { ...sampler.read(), model: model.value };
  }

  function setConfig(value) {
    sampler.set(value);
    model.value = shortModelId(models, value.model);
    modelStatus.check(model.value);
  }

  function showSoon(run) {
    shownRun = run;
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      output.show(shownRun, heatmap);
    });
  }

  function setRunning(running) {
    // Focus follows the button that can act (a disabled button drops it).
    const [from, to] = running ? [runButton, stopButton] : [stopButton, runButton];
    const follow = document.activeElement === from || document.activeElement === document.body;
    runButton.disabled = running;
    stopButton.disabled = !running;
    model.disabled = running;
    sampler.setDisabled(running);
    if (follow) to.focus();
  }

  async function run() {
    if (current || !sampler.check()) return;
    const text = prompt.value;
    if (!text) {
      notice.textContent = "Type a prompt first.";
      prompt.focus();
      return;
    }
    notice.textContent = "";
    const lane = { config: config(), heatmap, run: null };
    current = startRun(client, text, lane.config, { onUpdate: showSoon });
    lane.run = current.run;
    setRunning(true);
    shownRun = current.run;
    output.show(current.run, heatmap);
    await current.result;
    cancelAnimationFrame(frame);
    frame = 0;
    current = null;
    setRunning(false);
    shownRun = lane.run;
    output.show(lane.run, heatmap);
    lane.heatmap = heatmap;
    await keep(history.KINDS.run, text, [lane]);
  }

  async function keep(kind, text, lanes) {
    let found = null; // the listing prune read, shown as it is
    try {
      await history.save(client, kind, history.promptLabel(text), text, lanes);
      if (kind === history.KINDS.run) found = await history.prune(client, kind, history.KEEP.run);
    } catch (error) {
      notice.textContent = `Not saved on the server: ${describeError(error)}`;
    }
    await refresh(found);
  }

  async function savePrompt() {
    if (!sampler.check()) return;
    if (!prompt.value) {
      notice.textContent = "Type a prompt first.";
      prompt.focus();
      return;
    }
    await keep(history.KINDS.prompt, prompt.value, [{ config: config(), heatmap, run: null }]);
    notice.textContent = "Prompt saved.";
  }

  async function open(entry, withOutput) {
    if (current) {
      notice.textContent = "Stop the run before opening another.";
      return;
    }
    try {
      const loaded = await history.load(client, entry.id);
      const lane = loaded.lanes[0];
      prompt.value = loaded.prompt;
      if (lane) setConfig(lane.config);
      if (withOutput) {
        heatmap = Boolean(lane?.heatmap);
        heatmapButton.setAttribute("aria-pressed", String(heatmap));
        shownRun = lane?.run ?? null;
        output.show(shownRun, heatmap);
      }
      notice.textContent = withOutput ? `Opened the run of ${formatTime(entry.created_at)}.` : `Loaded “${entry.label}”.`;
      prompt.focus();
    } catch (error) {
      notice.textContent = describeError(error);
    }
  }

  async function forget(entry) {
    try {
      await history.remove(client, entry.id);
    } catch (error) {
      notice.textContent = describeError(error);
    }
    await refresh();
  }

  function fill(list, entries, empty, actions) {
    list.replaceChildren(
      ...(entries.length ? entries.map((entry) => historyRow(entry, actions(entry))) : [el("li", { class: "empty" }, empty)])
    );
  }

  /** Lists the saved prompts and past runs again (`found`: a listAll the caller just made). */
  async function refresh(found = null) {
    try {
      found = found ?? (await history.listAll(client));
    } catch (error) {
      notice.textContent = `History could not be read: ${describeError(error)}`;
      return;
    }
    fill(savedList, found.prompt, "No saved prompts yet: Save prompt keeps one here.", (entry) => [
      el("button", { type: "button", onclick: () => open(entry, false) }, "Load"),
      el("button", { type: "button", class: "danger", onclick: () => forget(entry) }, "Delete"),
    ]);
    fill(runsList, found.run, "No runs yet: each Run is kept here.", (entry) => [
      el("button", { type: "button", onclick: () => open(entry, true) }, "Open"),
      el("a", { href: `#/loom/${encodeURIComponent(entry.id)}` }, "Open in Loom"),
    ]);
  }

  setConfig({ model: models[0]?.id ?? null });
  output.show(null, heatmap);
  modelStatus.listen((id, warm) => {
    if (id === model.value) output.setWarming(warm === false);
  });

  return {
    element,
    refresh,
    models: () => [model.value],
    stop: () => current?.stop(),
  };
}
