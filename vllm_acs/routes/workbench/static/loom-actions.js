// The Loom API as the Loom view calls it (docs/decisions.md, "Looms (issue 12)"). Every call
// goes through the shell's client (the key, X-Acs-Workload: interactive, ApiError on failure).

const LOOMS = "/v1/looms";

/** The calls on the list of Looms. */
export function loomsApi(client) {
  return {
    list: (after) =>
      client.request("GET", `${LOOMS}?limit=100${after ? `&after=${encodeURIComponent(after)}` : ""}`),
    create: (prompt, title = null) => client.request("POST", LOOMS, { body: title ? { prompt, title } : { prompt } }),
    retitle: (id, title) => client.request("PATCH", `${LOOMS}/${encodeURIComponent(id)}`, { body: { title } }),
    remove: (id) => client.request("DELETE", `${LOOMS}/${encodeURIComponent(id)}`),
    importFile: (document) => client.request("POST", `${LOOMS}/import`, { body: document }),
  };
}

/** The calls on one Loom and its Nodes. */
export function loomApi(client, loomId) {
  const base = `${LOOMS}/${encodeURIComponent(loomId)}`;
  const node = (id) => `${base}/nodes/${encodeURIComponent(id)}`;
  return {
    read: () => client.request("GET", base),
    retitle: (title) => client.request("PATCH", base, { body: { title } }),
    exportDocument: () => client.request("GET", `${base}/export`),
    edit: (id, fields) => client.request("PATCH", node(id), { body: fields }),
    split: (id, offset, text) =>
      client.request("POST", `${node(id)}/split`, { body: text === undefined ? { offset } : { offset, text } }),
    addSibling: (id, text) => client.request("POST", `${node(id)}/siblings`, { body: { text } }),
    remove: (id) => client.request("DELETE", node(id)),
    replay: (id) => client.request("POST", `${node(id)}/replay`),
    score: (id, body) => client.request("POST", `${node(id)}/score`, { body }),
    /** A streamed branch: onEvent gets `started`, `delta` and `done` ({event, data}). Aborting
     * `signal` stops listening only: the branch goes on on the node. */
    branch: (id, body, onEvent, signal) =>
      client.stream(`${node(id)}/branch`, { ...body, stream: true }, { onEvent, signal }),
  };
}
