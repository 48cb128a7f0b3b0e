// One Loom (#/loom/<id>): the view bar (Export JSON, Export text, Import JSON, the legend), the
// sidebar (List or Graph), and the centre: the root prompt, the path's text with its heatmap, the
// selected Node's panel, its children, the branch controls. The chosen view and each Loom's
// selected Node are remembered in localStorage (loom-place.js). Every change goes to the API and
// the page then reads the Loom again, so what it shows is what the node holds; only a streamed
// branch's text is drawn as it arrives.

import { describeError, isAbort } from "./api.js";
import { el } from "./dom.js";
import { heatLegend } from "./heatmap.js";
import { loomApi, loomsApi } from "./loom-actions.js";
import { createBranchControls } from "./loom-branch.js";
import { createChildrenCard } from "./loom-children.js";
import { FileNotJson, download, fileStem, jsonFilePicker } from "./loom-files.js";
import { createGraph } from "./loom-graph.js";
import { bindHotkeys, createLegend } from "./loom-hotkeys.js";
import { loomTitle } from "./loom-list.js";
import { LoomModel, preview } from "./loom-model.js";
import { createNodePanel } from "./loom-node-panel.js";
import { renderPath } from "./loom-path.js";
import { rememberedNode, rememberNode } from "./loom-place.js";
import { createRootCard } from "./loom-root.js";
import { createTreeList } from "./loom-tree.js";

const VIEW_KEY = "vllm-acs.loom.view";
const HEATMAP_KEY = "vllm-acs.loom.heatmap";

export async function mountLoom(main, context, loomId) {
  const api = loomApi(context.client, loomId);
  let model;
  try {
    model = new LoomModel(await api.read());
  } catch (error) {
    main.replaceChildren(
      el("h1", {}, "Loom"),
      el("p", { class: "error", role: "alert" }, describeError(error)),
      el("p", {}, el("a", { href: "#/loom" }, "Back to your looms"))
    );
    return null;
  }
  return new LoomPage(main, context, api, model).mounted();
}

class LoomPage {
  constructor(main, context, api, model) {
    this.main = main;
    this.context = context;
    this.api = api;
    this.model = model;
    const remembered = rememberedNode(model.id);
    this.selectedId = model.node(remembered) ? remembered : model.rootId;
    this.viewName = localStorage.getItem(VIEW_KEY) === "graph" ? "graph" : "list";
    this.heatmap = localStorage.getItem(HEATMAP_KEY) !== "off";
    this.branching = false;
    this.busy = false;
    this.alive = true;
    this.leaving = new AbortController(); // stops listening to a branch when the page goes
    this.dirty = new Set(); // nodes whose streamed text the next frame draws
    this.redrawPending = false;
    this.build();
  }

  // ---- building the page -------------------------------------------------------------------

  build() {
    const select = (id, options) => this.select(id, options);
    this.views = {
      list: createTreeList({ model: this.model, onSelect: select }),
      graph: createGraph({ model: this.model, onSelect: select }),
    };
    this.stale = new Set(["list", "graph"]);
    this.legend = createLegend();
    this.picker = jsonFilePicker();
    this.alert = el("p", { class: "error", role: "alert", hidden: true });
    this.status = el("p", { class: "loom-status", role: "status" });
    this.heading = el("h1", { class: "loom-heading" });
    this.count = el("span", { class: "loom-count" });

    this.viewButtons = {
      list: el("button", { type: "button", class: "small segment", onclick: () => this.showView("list") }, "List"),
      graph: el("button", { type: "button", class: "small segment", onclick: () => this.showView("graph") }, "Graph"),
    };
    this.treeHost = el("div", { class: "tree-host" });
    const sidebar = el(
      "section",
      { class: "loom-sidebar card", "aria-label": "Tree" },
      el(
        "div",
        { class: "sidebar-head" },
        el("h2", {}, "Tree"),
        el("div", { class: "segmented", role: "group", "aria-label": "Tree view" }, this.viewButtons.list, this.viewButtons.graph)
      ),
      this.treeHost
    );

    this.rootCard = createRootCard({ onSet: (text, options) => this.setRoot(text, options) });

    this.heatToggle = el("button", { type: "button", class: "small", "aria-pressed": String(this.heatmap), onclick: () => this.toggleHeatmap() }, "Heatmap");
    this.pathText = el("div", { class: "path-text tokens", id: "path-text" });
    const pathCard = el(
      "section",
      { class: "card path-card", "aria-labelledby": "path-title" },
      el("div", { class: "card-head" }, el("h2", { id: "path-title" }, "Path"), heatLegend(), this.heatToggle),
      this.pathText
    );

    this.panel = createNodePanel({
      edit: () => this.startEditor("edit"),
      split: () => this.startEditor("split"),
      newSibling: () => this.startEditor("sibling"),
      remove: () => this.remove(),
      bookmark: () => this.bookmark(),
      replay: () => this.replay(),
      score: () => this.score(),
      commit: () => this.commitEditor(),
      cancel: () => this.cancelEditor(),
    });
    this.childrenCard = createChildrenCard({ onSelect: (id) => this.select(id) });
    this.branchControls = createBranchControls({ models: this.context.models, onBranch: () => this.branch() });

    const centre = el(
      "div",
      { class: "loom-centre" },
      this.rootCard.element,
      pathCard,
      el(
        "div",
        { class: "centre-grid" },
        el("div", { class: "centre-main" }, this.panel.element, this.childrenCard.element),
        el("div", { class: "card branch-card" }, this.branchControls.element)
      )
    );

    const bar = el(
      "div",
      { class: "loom-bar" },
      el("a", { href: "#/loom", class: "back-link" }, "← Looms"),
      this.heading,
      this.count,
      el(
        "div",
        { class: "bar-actions", role: "group", "aria-label": "Export and import" },
        el("button", { type: "button", class: "small", onclick: () => this.exportJson() }, "Export JSON"),
        el("button", { type: "button", class: "small", onclick: () => this.exportText() }, "Export text"),
        el("button", { type: "button", class: "small", onclick: () => this.importJson() }, "Import JSON"),
        this.picker.input,
        el("button", { type: "button", class: "small", "aria-keyshortcuts": "?", onclick: () => this.legend.toggle() }, "Shortcuts ", el("kbd", {}, "?"))
      )
    );
    this.layout = el("div", { class: "loom-layout" }, sidebar, centre);
    this.main.replaceChildren(el("div", { class: "loom-page" }, bar, this.alert, this.status, this.layout), this.legend.element);
  }

  mounted() {
    this.unbind = bindHotkeys(
      {
        previousSibling: () => this.moveAmongSiblings(-1),
        nextSibling: () => this.moveAmongSiblings(1),
        parent: () => this.moveTo(this.model.parent(this.selectedId)?.id),
        firstChild: () => this.moveTo(this.model.node(this.selectedId)?.children[0]),
        branch: () => this.branch(),
        edit: () => this.startEditor("edit"),
        split: () => this.startEditor("split"),
        newSibling: () => this.startEditor("sibling"),
        remove: () => this.remove(),
        escape: () => this.cancelEditor() || this.panel.closeConfirm(),
      },
      this.legend
    );
    this.renderTitle();
    this.showView(this.viewName, { remember: false });
    this.renderCentre();
    this.rootCard.show(this.model.root?.text ?? "", { folded: this.model.nodes.size > 1 });
    return { unmount: () => this.unmount() };
  }

  unmount() {
    this.alive = false;
    this.leaving.abort();
    this.unbind?.();
    this.legend.close();
  }

  get activeView() {
    return this.views[this.viewName];
  }

  renderTitle() {
    this.heading.textContent = loomTitle(this.model);
    const size = this.model.nodes.size;
    this.count.textContent = `${size} ${size === 1 ? "node" : "nodes"}`;
  }

  showView(name, { remember = true } = {}) {
    const focusWasInTree = this.treeHost.contains(document.activeElement);
    this.viewName = name;
    if (remember) localStorage.setItem(VIEW_KEY, name);
    for (const [key, button] of Object.entries(this.viewButtons)) button.setAttribute("aria-pressed", String(key === name));
    this.layout.classList.toggle("view-graph", name === "graph");
    this.layout.classList.toggle("view-list", name === "list");
    const view = this.activeView;
    if (this.stale.has(name)) {
      view.rebuild();
      this.stale.delete(name);
    }
    this.treeHost.replaceChildren(view.element);
    view.select(this.selectedId);
    if (name === "graph") view.shown();
    if (focusWasInTree) view.focusSelected();
  }

  /** The tree changed: the view on show is drawn again, the other when it is next shown. */
  rebuildViews() {
    this.stale = new Set(Object.keys(this.views).filter((name) => name !== this.viewName));
    this.activeView.rebuild();
    this.renderTitle();
  }

  // ---- selection and the centre -------------------------------------------------------------

  select(id, { focus = false } = {}) {
    if (!this.model.node(id)) return;
    const focusWasInTree = this.treeHost.contains(document.activeElement);
    if (id !== this.selectedId) {
      this.cancelEditor();
      this.panel.closeConfirm();
      this.panel.say();
    }
    this.selectedId = id;
    rememberNode(this.model.id, id);
    this.activeView.select(id, { focus: focus || focusWasInTree });
    this.renderCentre();
  }

  moveTo(id) {
    if (id) this.select(id);
  }

  moveAmongSiblings(step) {
    const siblings = this.model.siblings(this.selectedId);
    const at = siblings.findIndex((node) => node.id === this.selectedId);
    this.moveTo(siblings[at + step]?.id);
  }

  renderCentre() {
    const node = this.model.node(this.selectedId);
    if (!node) return;
    renderPath(this.pathText, this.model, node.id, { heatmap: this.heatmap });
    this.panel.show(node, { busy: this.busy });
    this.childrenCard.show(this.model.children(node.id));
  }

  toggleHeatmap() {
    this.heatmap = !this.heatmap;
    localStorage.setItem(HEATMAP_KEY, this.heatmap ? "on" : "off");
    this.heatToggle.setAttribute("aria-pressed", String(this.heatmap));
    this.renderCentre();
  }

  // ---- talking to the API --------------------------------------------------------------------

  say(text) {
    this.status.textContent = text;
  }

  fail(error) {
    this.alert.textContent = error instanceof FileNotJson ? error.message : describeError(error);
    this.alert.hidden = false;
  }

  /**
   * Runs one change: the alert cleared, the buttons off meanwhile, the Loom read again after.
   * `work` answers {select, message}: the Node to select then, and what to say once it shows.
   */
  async change(work) {
    if (this.busy) return;
    this.alert.hidden = true;
    this.say("");
    this.busy = true;
    this.panel.show(this.model.node(this.selectedId), { busy: true });
    let done = {};
    try {
      done = (await work()) ?? {};
    } catch (error) {
      this.fail(error);
    } finally {
      this.busy = false;
    }
    if (!this.alive) return;
    await this.reload(done.select ?? this.selectedId);
    if (done.message) this.say(done.message);
  }

  async reload(selectId = this.selectedId) {
    try {
      this.model.load(await this.api.read());
    } catch (error) {
      this.fail(error);
      return;
    }
    if (!this.alive) return;
    const focusWasInTree = this.treeHost.contains(document.activeElement);
    this.rebuildViews();
    this.selectedId = this.model.node(selectId) ? selectId : this.model.rootId;
    rememberNode(this.model.id, this.selectedId);
    this.activeView.select(this.selectedId, { focus: focusWasInTree });
    this.renderCentre();
  }

  async setRoot(text, { confirmed }) {
    const children = this.model.children(this.model.rootId);
    if (children.length && !confirmed) {
      this.rootCard.askReplace(this.model.nodes.size - 1);
      return;
    }
    this.rootCard.closeConfirm();
    await this.change(async () => {
      for (const child of children) await this.api.remove(child.id);
      await this.api.edit(this.model.rootId, { text });
      if (!this.model.title?.trim() && text.trim()) await this.api.retitle(preview(text, 60));
      return { select: this.model.rootId, message: "Root set." };
    });
    if (this.model.root?.text === text) this.rootCard.show(text, { folded: true });
  }

  async branch() {
    const parent = this.model.node(this.selectedId);
    if (this.branching || this.busy || !parent) return;
    if (parent.status !== "ready") {
      this.say(`This node is ${parent.status}: branch from a ready node.`);
      return;
    }
    const body = this.branchControls.body();
    if (!body) return;
    this.alert.hidden = true;
    this.branching = true;
    this.branchControls.busy(true);
    this.say(`Branching ${body.n} from the selected node…`);
    let message = "";
    try {
      let answer = null;
      const onEvent = ({ event, data }) => {
        if (!this.alive) return;
        if (event === "started") {
          this.model.addNodes(data.nodes);
          this.rebuildViews();
          this.renderCentre();
        } else if (event === "delta") {
          this.model.appendText(data.node_id, data.text);
          this.redrawSoon(data.node_id);
        } else if (event === "done") {
          answer = data;
        }
      };
      await this.api.branch(parent.id, body, onEvent, this.leaving.signal);
      const made = answer?.nodes?.length ?? 0;
      const seed = answer?.nodes?.[0]?.generation?.branch_seed;
      message = `Branched: ${made} ${made === 1 ? "child" : "children"}${seed === undefined ? "" : ` (seed ${seed})`}.`;
    } catch (error) {
      if (isAbort(error)) return;
      this.fail(error);
    }
    if (this.alive) await this.reload();
    this.say(message);
    this.branching = false;
    this.branchControls.busy(false);
  }

  /** Streamed text is drawn once per frame, whatever the number of deltas. */
  redrawSoon(id) {
    this.dirty.add(id);
    if (this.redrawPending) return;
    this.redrawPending = true;
    requestAnimationFrame(() => {
      this.redrawPending = false;
      if (!this.alive) return;
      for (const dirtyId of this.dirty) this.activeView.update(dirtyId);
      this.dirty.clear();
      this.childrenCard.show(this.model.children(this.selectedId));
    });
  }

  startEditor(mode) {
    const node = this.model.node(this.selectedId);
    if (!node || this.busy) return;
    if (mode === "sibling" && node.parent_id === null) {
      this.say("The root has no siblings: to start from another prompt, make a new loom.");
      return;
    }
    if (mode !== "sibling" && node.status !== "ready") {
      this.say(`This node is ${node.status}: it cannot be edited until it is ready.`);
      return;
    }
    if (mode === "split" && node.text.length < 2) {
      this.say("A node needs two characters or more to split.");
      return;
    }
    this.panel.closeConfirm();
    this.panel.openEditor(mode, mode === "sibling" ? "" : node.text);
  }

  cancelEditor() {
    const was = this.panel.closeEditor();
    if (was) this.activeView.focusSelected();
    return was;
  }

  async commitEditor() {
    const mode = this.panel.editorMode;
    const node = this.model.node(this.selectedId);
    const field = this.panel.editorField;
    const text = field.value;
    if (!mode || !node) return;
    if (mode === "split") {
      const offset = field.selectionStart;
      if (offset < 1 || offset >= text.length) {
        this.fail(new Error("Put the cursor inside the text (not at its start or end), then Split here."));
        field.focus();
        return;
      }
      this.panel.closeEditor();
      await this.change(async () => {
        await this.api.split(node.id, offset, text === node.text ? undefined : text);
        return { select: node.id, message: `Split: the node keeps ${offset} characters; its children moved to the new part.` };
      });
    } else if (mode === "edit") {
      this.panel.closeEditor();
      await this.change(async () => {
        await this.api.edit(node.id, { text });
        return { select: node.id, message: "Edit saved." };
      });
    } else {
      this.panel.closeEditor();
      await this.change(async () => {
        const made = await this.api.addSibling(node.id, text);
        return { select: made.data[0]?.id, message: "Sibling added." };
      });
    }
    this.panel.buttons.edit.focus();
  }

  remove() {
    const node = this.model.node(this.selectedId);
    if (!node || this.busy) return;
    if (node.parent_id === null) {
      this.say("The root cannot be deleted: delete the loom from the list instead.");
      return;
    }
    const count = this.model.subtreeSize(node.id);
    const doIt = () =>
      this.change(async () => {
        const answer = await this.api.remove(node.id);
        const count = answer.deleted.length;
        return { select: node.parent_id, message: `Deleted ${count} ${count === 1 ? "node" : "nodes"}.` };
      }).then(() => this.activeView.focusSelected());
    if (count > 1) this.panel.askDelete(count, doIt);
    else doIt();
  }

  async bookmark() {
    const node = this.model.node(this.selectedId);
    await this.change(async () => {
      await this.api.edit(node.id, { bookmarked: !node.bookmarked });
      return { select: node.id };
    });
  }

  async replay() {
    const node = this.model.node(this.selectedId);
    this.panel.say("Replaying…");
    let answer = null;
    await this.change(async () => {
      answer = await this.api.replay(node.id);
      return { select: node.id };
    });
    if (!answer) return this.panel.say();
    const seed = answer.seed === null || answer.seed === undefined ? "" : ` with seed ${answer.seed}`;
    this.panel.say(
      answer.identical
        ? el("p", { class: "replay identical" }, `Replay identical: the model wrote the same text again${seed}.`)
        : el(
            "div",
            { class: "replay different" },
            el("p", {}, `Replay different: the model wrote other text${seed}.`),
            el("pre", { class: "replay-text" }, answer.text)
          )
    );
  }

  async score() {
    const node = this.model.node(this.selectedId);
    const logprobs = Math.max(this.branchControls.logprobs(), 1);
    this.panel.say("Scoring…");
    let answer = null;
    await this.change(async () => {
      answer = await this.api.score(node.id, { model: this.branchControls.model(), logprobs });
      return { select: node.id };
    });
    this.panel.say(answer ? el("p", {}, `Scored ${answer.prompt_token_ids.length} tokens of the path with ${answer.model}: the heatmap shows each token's logprob.`) : "");
  }

  // ---- files -------------------------------------------------------------------------------

  async exportJson() {
    try {
      const document = await this.api.exportDocument();
      download(`${fileStem(this.model.title)}.loom.json`, JSON.stringify(document, null, 2), "application/json");
      this.say(`Exported ${document.nodes.length} nodes as JSON.`);
    } catch (error) {
      this.fail(error);
    }
  }

  exportText() {
    download(`${fileStem(this.model.title)}.txt`, this.model.pathText(this.selectedId), "text/plain");
    this.say("Exported the current path as text.");
  }

  async importJson() {
    this.alert.hidden = true;
    try {
      const document = await this.picker.pick();
      if (document === null) return;
      const loom = await loomsApi(this.context.client).importFile(document);
      this.context.navigate(`#/loom/${loom.id}`);
    } catch (error) {
      this.fail(error);
    }
  }
}
