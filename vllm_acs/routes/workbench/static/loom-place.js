// Where each Loom was left: the selected Node per Loom, in localStorage, so that reopening a Loom
// (a reload, a link, the list) lands on the Node the researcher was reading. The newest PLACES
// Looms are kept; a Node deleted since is ignored (the page falls back to the root).

const PLACES_KEY = "vllm-acs.loom.places";
export const PLACES = 50;

function places() {
  try {
    const stored = JSON.parse(localStorage.getItem(PLACES_KEY) ?? "[]");
    return Array.isArray(stored) ? stored.filter((entry) => Array.isArray(entry) && entry.length === 2) : [];
  } catch {
    return []; // unreadable: start again rather than fail the page
  }
}

/** The Node last selected in Loom `loomId`, or null. */
export function rememberedNode(loomId) {
  return places().find(([loom]) => loom === loomId)?.[1] ?? null;
}

/** Remembers `nodeId` as Loom `loomId`'s place, newest first. */
export function rememberNode(loomId, nodeId) {
  const kept = places().filter(([loom]) => loom !== loomId);
  try {
    localStorage.setItem(PLACES_KEY, JSON.stringify([[loomId, nodeId], ...kept].slice(0, PLACES)));
  } catch {
    // storage full or refused: the place is simply not remembered
  }
}
