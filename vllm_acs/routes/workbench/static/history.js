// The Workbench's history on the server, through the public Loom API (so a script can list it):
// the one place that defines how a saved prompt, a past single run or a Compare run is a Loom.
//
//   title   `workbench:prompt:<name>`     a saved prompt (kept until deleted)
//           `workbench:run:<prompt>`      a past single-pane run (the newest 50 kept)
//           `workbench:compare:<prompt>`  a Compare run (every Run all; the newest 20 kept)
//   root    the prompt, verbatim (origin root), tagged `workbench:v1`
//   lanes   one child of the root per lane, in lane order (a single run or a saved prompt has
//           one): the output as its text (origin model; status failed with the error envelope
//           when the run failed), `generation` {model, checkpoint, seed, n: 1, parameters,
//           finish_reason, request_id} as a Loom branch records it, per-token logprobs as
//           `tokens`, and tags `workbench:lane`, `workbench:state=<idle|done|stopped|failed>`,
//           `workbench:seed=auto` (the seed was drawn for this run), `workbench:heatmap`.
//
// Each is written in one `POST /v1/looms/import` of a `vllm-acs.loom` document; `<prompt>` in a
// title is the prompt's first line, shortened. See docs/decisions.md, "The Workbench".

import { ApiError } from "./api.js";
import { fromLoomTokens } from "./heatmap.js";
import { DEFAULT_CONFIG } from "./sampler.js";

export const PREFIX = "workbench:";
export const KINDS = Object.freeze({ prompt: "prompt", run: "run", compare: "compare" });
export const KEEP = Object.freeze({ run: 50, compare: 20 });
const TAG_ROOT = "workbench:v1";
const TAG_LANE = "workbench:lane";
const TAG_STATE = "workbench:state=";
const TAG_SEED_AUTO = "workbench:seed=auto";
const TAG_HEATMAP = "workbench:heatmap";
// A run's sampling parameters as recorded: the sampler's fields but the model and the seed (the
// generation records those apart).
const PARAMETERS = Object.keys(DEFAULT_CONFIG).filter((name) => name !== "model" && name !== "seed");
const TITLE_MAX = 200;
const LIST_PAGES = 20; // 100 Looms a page

/** The first line of a prompt, shortened, as a title's tail. */
export function promptLabel(prompt, length = 60) {
  const line = prompt.trim().split("\n")[0].trim() || "(empty prompt)";
  return line.length > length ? `${line.slice(0, length - 1)}…` : line;
}

export function titleOf(kind, label) {
  return `${PREFIX}${kind}:${label}`.slice(0, TITLE_MAX);
}

/** {kind, label} of a Workbench title, or null for any other Loom. */
export function parseTitle(title) {
  if (!title?.startsWith(PREFIX)) return null;
  const rest = title.slice(PREFIX.length);
  const colon = rest.indexOf(":");
  if (colon < 0) return null;
  const kind = rest.slice(0, colon);
  if (!Object.values(KINDS).includes(kind)) return null;
  return { kind, label: rest.slice(colon + 1) };
}

function loomTokens(tokens) {
  if (!tokens?.length) return null;
  let offset = 0;
  return tokens.map((token) => {
    const entry = {
      text: token.text,
      id: null,
      logprob: token.logprob,
      offset,
      top_logprobs: token.alternatives.map((a) => ({ text: a.text, logprob: a.logprob })),
    };
    offset += token.text.length;
    return entry;
  });
}

/**
 * A lane as a Node of the export document. `lane` is {config, heatmap, run} where run is null
 * (never ran) or run.js's run ({state, text, tokens, seed, seedAuto, checkpoint, ...}).
 */
function laneNode(lane, index) {
  const { config, heatmap, run } = lane;
  const state = run ? run.state : "idle";
  const failed = state === "failed";
  const tags = [TAG_LANE, TAG_STATE + state];
  if (run ? run.seedAuto : config.seed === null) tags.push(TAG_SEED_AUTO);
  if (heatmap) tags.push(TAG_HEATMAP);
  return {
    id: `lane-${index + 1}`,
    parent_id: "root",
    text: run?.text ?? "",
    origin: "model",
    status: failed ? "failed" : "ready",
    generation: {
      model: config.model,
      checkpoint: run?.checkpoint ?? null,
      seed: run ? run.seed : config.seed,
      n: 1,
      parameters: Object.fromEntries(PARAMETERS.map((name) => [name, config[name]])),
      finish_reason: run?.finishReason ?? (state === "stopped" ? "stopped" : null),
      request_id: run?.requestId ?? null,
    },
    tokens: loomTokens(run?.tokens),
    error: failed
      ? { error: { code: run.error?.code ?? "error", message: run.error?.message ?? "" }, request_id: run.error?.requestId ?? null }
      : null,
    tags,
  };
}

export function exportDocument(kind, label, prompt, lanes) {
  return {
    format: "vllm-acs.loom",
    version: 1,
    title: titleOf(kind, label),
    nodes: [
      { id: "root", parent_id: null, text: prompt, origin: "root", tags: [TAG_ROOT] },
      ...lanes.map(laneNode),
    ],
  };
}

/** Saves an entry; returns the new Loom's summary ({id, title, created_at, ...}). */
export async function save(client, kind, label, prompt, lanes) {
  return client.request("POST", "/v1/looms/import", { body: exportDocument(kind, label, prompt, lanes) });
}

/** The key's Workbench Looms by kind, newest first: {prompt: [...], run: [...], compare: [...]}
 * (summaries, each with its `label`). */
export async function listAll(client) {
  const found = Object.fromEntries(Object.values(KINDS).map((kind) => [kind, []]));
  let after = null;
  for (let page = 0; page < LIST_PAGES; page++) {
    const query = after ? `?limit=100&after=${encodeURIComponent(after)}` : "?limit=100";
    const answer = await client.request("GET", `/v1/looms${query}`);
    for (const loom of answer.data) {
      const parsed = parseTitle(loom.title);
      if (parsed) found[parsed.kind].push({ ...loom, label: parsed.label });
    }
    if (!answer.has_more) break;
    after = answer.last_id;
  }
  return found;
}

export async function list(client, kind) {
  return (await listAll(client))[kind];
}

/** Deletes all but the newest `keep` entries of a kind (after a save); returns the listing as
 * it now stands (listAll's shape), so the caller shows it without listing again. */
export async function prune(client, kind, keep) {
  const found = await listAll(client);
  await Promise.all(found[kind].slice(keep).map((entry) => remove(client, entry.id)));
  return { ...found, [kind]: found[kind].slice(0, keep) };
}

export async function remove(client, id) {
  try {
    await client.request("DELETE", `/v1/looms/${encodeURIComponent(id)}`);
  } catch (error) {
    if (error.code !== "loom_not_found") throw error; // gone already (another tab)
  }
}

function tagValue(tags, prefix) {
  const tag = (tags ?? []).find((t) => t.startsWith(prefix));
  return tag ? tag.slice(prefix.length) : null;
}

function laneFromNode(node) {
  const generation = node.generation ?? {};
  const parameters = generation.parameters ?? {};
  const tags = node.tags ?? [];
  const state = tagValue(tags, TAG_STATE) ?? (node.status === "failed" ? "failed" : "done");
  const seedAuto = tags.includes(TAG_SEED_AUTO);
  const config = { ...DEFAULT_CONFIG, model: generation.model ?? null, seed: seedAuto ? null : generation.seed ?? null };
  for (const name of PARAMETERS) if (parameters[name] !== undefined && parameters[name] !== null) config[name] = parameters[name];
  const envelope = node.error?.error ?? null;
  const run =
    state === "idle"
      ? null
      : {
          state,
          text: node.text,
          tokens: fromLoomTokens(node.tokens),
          seed: generation.seed ?? null,
          seedAuto,
          checkpoint: generation.checkpoint ?? null,
          finishReason: generation.finish_reason ?? null,
          requestId: generation.request_id ?? null,
          error: envelope
            ? new ApiError({ code: envelope.code, message: envelope.message, requestId: node.error.request_id ?? null })
            : null,
        };
  return { config, heatmap: tags.includes(TAG_HEATMAP), run };
}

/** An entry read back: {id, kind, label, created_at, prompt, lanes: [{config, heatmap, run}]}. */
export async function load(client, id) {
  const loom = await client.request("GET", `/v1/looms/${encodeURIComponent(id)}`);
  const root = loom.nodes.find((n) => n.parent_id === null);
  const lanes = loom.nodes
    .filter((n) => n.parent_id === root.id && (n.tags ?? []).includes(TAG_LANE))
    .map(laneFromNode);
  return { id: loom.id, ...parseTitle(loom.title), created_at: loom.created_at, prompt: root.text, lanes };
}
