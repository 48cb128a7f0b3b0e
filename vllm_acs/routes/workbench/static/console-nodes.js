// Console: the deployment's registry. Each model with its warm nodes, and every node with its
// address, heartbeat and versions; refreshed every 10 s while shown. A node is warm while its
// heartbeat is younger than the registry's TTL; a silent one stays listed until it is forgotten.

import { describeError } from "./api.js";
import { el, formatTime } from "./dom.js";
import { ago, badge, table } from "./console-common.js";

const REFRESH_MS = 10_000;

export function mount(box, context) {
  const { client } = context;
  const alert = el("p", { class: "error", role: "alert", hidden: true });
  const updated = el("span", { class: "hint", role: "status" });
  const models = el("div", { class: "model-cards" });
  const nodesBox = el("section", { class: "card keys-card" });
  const refresh = el("button", { type: "button", onclick: () => load() }, "Refresh");
  box.replaceChildren(
    el("div", { class: "section-head" }, el("h2", {}, "Nodes"), refresh, updated),
    alert,
    el("section", { "aria-labelledby": "models-title" }, el("h3", { id: "models-title", class: "visually-hidden" }, "Models"), models),
    nodesBox,
  );

  let stopped = false;
  let timer = null;
  async function load() {
    clearTimeout(timer);
    try {
      const listed = await client.request("GET", "/v1/admin/nodes");
      if (stopped) return;
      alert.hidden = true;
      const now = listed.generated_at;
      models.replaceChildren(
        ...(listed.models.length
          ? listed.models.map((model) =>
              el(
                "article",
                { class: "card model-card", "aria-label": `Model ${model.id}` },
                el("code", { class: "model-name" }, model.id),
                badge(model.warm ? "warm" : "silent", model.warm ? "warm" : "no warm node"),
                el("p", { class: "hint" }, `${model.nodes} warm node${model.nodes === 1 ? "" : "s"} of ${listed.data.filter((n) => n.model_id === model.id).length} listed`),
              ),
            )
          : [el("p", { class: "empty card" }, "No node has announced itself yet.")]),
      );
      nodesBox.replaceChildren(
        table(
          `Nodes (${listed.data.length})`,
          ["Node", "Model", "State", "Last heartbeat", "Started", "Plugin", "vLLM"],
          listed.data.map((node) =>
            el(
              "tr",
              { dataset: { nodeId: node.id } },
              el("th", { scope: "row" }, el("code", {}, node.id), el("span", { class: "sub" }, node.address)),
              el("td", {}, el("code", {}, node.model_id), el("span", { class: "sub" }, node.checkpoint)),
              el("td", {}, badge(node.warm ? "warm" : "silent", node.warm ? "warm" : "silent")),
              el("td", {}, el("span", { title: formatTime(node.last_heartbeat_at) }, ago(node.last_heartbeat_at, now))),
              el("td", {}, formatTime(node.started_at)),
              el("td", {}, node.plugin_version ?? "unknown"),
              el("td", {}, node.vllm_version ?? "unknown"),
            ),
          ),
          "No nodes.",
        ),
      );
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      if (stopped) return;
      alert.textContent = describeError(error);
      alert.hidden = false;
    }
    if (!stopped) timer = setTimeout(load, REFRESH_MS);
  }
  load();
  return {
    unmount() {
      stopped = true;
      clearTimeout(timer);
    },
  };
}
