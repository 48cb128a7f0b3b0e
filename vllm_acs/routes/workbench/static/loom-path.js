// The centre panel's text: the path from the root to the selected Node, one segment per Node,
// model tokens coloured by their logprob (heatmap.js) and a click on a token giving its top-k.

import { el } from "./dom.js";
import { fromLoomTokens, renderTokens } from "./heatmap.js";

/**
 * The tokens of a Node to draw, each with its share of the Node's text, so the text shown is
 * exactly the Node's text: a branch's tokens carry `offset` (where their share starts; a token
 * holding part of a multi-byte character has an empty share and is left out); tokens without
 * offsets (an import, a score) are laid along the text while their texts match it, and whatever
 * is left reads as plain text. Null when the Node has no token data.
 */
export function displayTokens(node) {
  const source = node.tokens?.length ? node.tokens : node.score?.tokens?.length ? node.score.tokens : null;
  if (!source) return null;
  const text = node.text;
  const shares = byOffsets(source, text) ?? byTexts(source, text);
  return shares
    .filter(([, start, end]) => end > start)
    .map(([token, start, end]) => {
      const shown = token ? fromLoomTokens([token])[0] : { logprob: null, alternatives: [] };
      return { ...shown, text: text.slice(start, end) };
    });
}

function byOffsets(tokens, text) {
  if (!tokens.every((t) => Number.isInteger(t.offset))) return null;
  const shares = [];
  for (let k = 0; k < tokens.length; k += 1) {
    const start = tokens[k].offset;
    const end = k + 1 < tokens.length ? tokens[k + 1].offset : text.length;
    if (start < 0 || end < start || end > text.length) return null;
    shares.push([tokens[k], start, end]);
  }
  if (tokens.length && tokens[0].offset > 0) shares.unshift([null, 0, tokens[0].offset]);
  return shares;
}

function byTexts(tokens, text) {
  const shares = [];
  let at = 0;
  for (const token of tokens) {
    const piece = token.text ?? "";
    if (piece && text.startsWith(piece, at)) {
      shares.push([token, at, at + piece.length]);
      at += piece.length;
    }
  }
  if (at < text.length) shares.push([null, at, text.length]);
  return shares;
}

/**
 * Draws the path into `container`: each Node a segment (the selected one marked), tokens where
 * the Node has them. Only the selected Node's tokens are in the tab order (the ancestors' are
 * still a click away), so Tab does not walk through the whole story.
 */
export function renderPath(container, model, selectedId, { heatmap }) {
  const segments = model.path(selectedId).map((node) => {
    const selected = node.id === selectedId;
    const segment = el("span", {
      class: `segment origin-${node.origin}${selected ? " selected" : ""}${node.status !== "ready" ? ` ${node.status}` : ""}`,
      dataset: { nodeId: node.id },
    });
    const tokens = displayTokens(node);
    if (tokens?.length) {
      renderTokens(segment, tokens, { heatmap });
      if (!selected) for (const button of segment.querySelectorAll(".tok")) button.tabIndex = -1;
    } else {
      segment.textContent = node.text;
    }
    return segment;
  });
  if (model.path(selectedId).every((node) => node.text === "")) {
    segments.push(el("span", { class: "path-empty" }, "Nothing yet: type a prompt under “Root prompt” and press Set root (replaces tree)."));
  }
  container.replaceChildren(...segments);
}
