// The sidebar's Graph view: one box per Node, branching left to right, the path to the selected
// Node highlighted. Drag to pan, scroll (or the +/− buttons) to zoom, click a box to select it.
// SVG built with DOM calls (no markup strings); the boxes form an ARIA tree like the List view.

import { el } from "./dom.js";
import { originLabel, preview } from "./loom-model.js";

const SVG = "http://www.w3.org/2000/svg";
export const BOX = { width: 176, height: 34, column: 220, row: 44, margin: 24 };
const ZOOM = { min: 0.03, max: 2.5, step: 1.25, readable: 0.8 };

function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
  node.append(...children.filter(Boolean));
  return node;
}

/**
 * Where each Node's box goes: its column is its depth, a leaf takes the next row, a parent sits
 * on its first child's row, so a chain of continuations reads as one straight line and its forks
 * hang below it. Pure; O(nodes).
 */
export function layoutTree(model) {
  const places = new Map();
  if (!model.root) return { places, width: 0, height: 0 };
  let nextRow = 0;
  let deepest = 0;
  // Post-order without recursion (a socketteer file may be thousands of levels deep).
  const stack = [{ id: model.rootId, depth: 0, visited: false }];
  while (stack.length) {
    const item = stack.pop();
    const children = model.node(item.id).children;
    if (!item.visited && children.length) {
      stack.push({ ...item, visited: true });
      for (let k = children.length - 1; k >= 0; k -= 1) stack.push({ id: children[k], depth: item.depth + 1, visited: false });
      continue;
    }
    let row;
    if (children.length) {
      row = places.get(children[0]).row;
    } else {
      row = nextRow;
      nextRow += 1;
    }
    deepest = Math.max(deepest, item.depth);
    places.set(item.id, {
      depth: item.depth,
      row,
      x: BOX.margin + item.depth * BOX.column,
      y: BOX.margin + row * BOX.row,
    });
  }
  return {
    places,
    width: 2 * BOX.margin + deepest * BOX.column + BOX.width,
    height: 2 * BOX.margin + Math.max(0, nextRow - 1) * BOX.row + BOX.height,
  };
}

function edgePath(from, to) {
  const x1 = from.x + BOX.width;
  const y1 = from.y + BOX.height / 2;
  const x2 = to.x;
  const y2 = to.y + BOX.height / 2;
  const bend = (x2 - x1) / 2;
  return `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`;
}

export function createGraph({ model, onSelect }) {
  const edges = svg("g", { class: "edges" });
  const boxes = svg("g", { class: "boxes", role: "tree", "aria-label": "Loom graph" });
  const viewport = svg("g", { class: "viewport" }, edges, boxes);
  const canvas = svg("svg", { class: "graph-canvas", role: "group", "aria-label": "Loom graph: drag to pan, scroll to zoom" }, viewport);
  const zoomLabel = el("span", { class: "zoom-level", "aria-live": "polite" }, "100%");
  const controls = el(
    "div",
    { class: "graph-controls" },
    el("button", { type: "button", class: "small", "aria-label": "Zoom out", onclick: () => zoomBy(1 / ZOOM.step) }, "−"),
    zoomLabel,
    el("button", { type: "button", class: "small", "aria-label": "Zoom in", onclick: () => zoomBy(ZOOM.step) }, "+"),
    el("button", { type: "button", class: "small", onclick: () => fit() }, "Fit"),
    el("button", { type: "button", class: "small", onclick: () => centreOn(selectedId, { readable: true }) }, "Centre")
  );
  const element = el("div", { class: "graph" }, controls, el("div", { class: "graph-frame" }, canvas));

  const shapes = new Map(); // id -> {box, edge}
  let layout = { places: new Map(), width: 0, height: 0 };
  let selectedId = null;
  let onPath = new Set();
  const view = { x: 0, y: 0, scale: 1 };

  function applyView() {
    viewport.setAttribute("transform", `translate(${view.x.toFixed(1)} ${view.y.toFixed(1)}) scale(${view.scale.toFixed(4)})`);
    zoomLabel.textContent = `${Math.round(view.scale * 100)}%`;
  }

  function size() {
    const box = canvas.getBoundingClientRect();
    return { width: box.width || 400, height: box.height || 400 };
  }

  function zoomAt(factor, px, py) {
    const scale = Math.min(ZOOM.max, Math.max(ZOOM.min, view.scale * factor));
    const ratio = scale / view.scale;
    view.x = px - (px - view.x) * ratio;
    view.y = py - (py - view.y) * ratio;
    view.scale = scale;
    applyView();
  }

  function zoomBy(factor) {
    const { width, height } = size();
    zoomAt(factor, width / 2, height / 2);
  }

  /** The whole tree in the frame (not smaller than the minimum zoom). */
  function fit() {
    const { width, height } = size();
    const scale = Math.min(1, width / Math.max(1, layout.width), height / Math.max(1, layout.height));
    view.scale = Math.max(ZOOM.min, scale);
    view.x = (width - layout.width * view.scale) / 2;
    view.y = Math.max(0, (height - layout.height * view.scale) / 2);
    applyView();
  }

  /** Puts the Node's box a third in from the left, midway down (`readable`: zoomed in to 80%
   * at least). */
  function centreOn(id, { readable = false } = {}) {
    const place = layout.places.get(id);
    if (!place) return;
    if (readable && view.scale < ZOOM.readable) view.scale = ZOOM.readable;
    const { width, height } = size();
    view.x = width / 3 - (place.x + BOX.width / 2) * view.scale;
    view.y = height / 2 - (place.y + BOX.height / 2) * view.scale;
    applyView();
  }

  /** Pans just enough to show the Node's box (with a margin) when it is outside the frame. */
  function reveal(id) {
    const place = layout.places.get(id);
    if (!place) return;
    const { width, height } = size();
    const left = view.x + place.x * view.scale;
    const top = view.y + place.y * view.scale;
    const right = left + BOX.width * view.scale;
    const bottom = top + BOX.height * view.scale;
    const margin = 24;
    if (left < margin || right > width - margin || top < margin || bottom > height - margin) centreOn(id);
  }

  function boxText(node) {
    return node.parent_id === null && node.text === "" ? "(empty root)" : preview(node.text, 26);
  }

  /** The box's name: its visible text first (what a voice user says), then what it is. */
  function boxLabel(node) {
    return `${boxText(node)}, ${originLabel(node)}${node.bookmarked ? ", bookmarked" : ""}`;
  }

  function boxFor(node, place, depth, position, setSize) {
    const group = svg(
      "g",
      {
        class: `gnode origin-${node.origin} status-${node.status}`,
        role: "treeitem",
        tabindex: "-1",
        "aria-level": depth + 1,
        "aria-posinset": position,
        "aria-setsize": setSize,
        "aria-selected": "false",
        "aria-label": boxLabel(node),
        transform: `translate(${place.x} ${place.y})`,
        "data-node-id": node.id,
      },
      svg("rect", { class: "box", width: BOX.width, height: BOX.height, rx: 6 }),
      svg("rect", { class: "stripe", width: 5, height: BOX.height, rx: 2 }),
      svg("text", { x: 12, y: BOX.height / 2 + 4 }, boxText(node)),
      node.bookmarked ? bookmarkMark() : null
    );
    return group;
  }

  /** A small star drawn (not a character), in the box's top right corner. */
  function bookmarkMark() {
    const points = [];
    for (let k = 0; k < 10; k += 1) {
      const radius = k % 2 ? 2.6 : 6;
      const angle = (Math.PI / 5) * k - Math.PI / 2;
      points.push(`${(BOX.width - 9 + radius * Math.cos(angle)).toFixed(1)},${(9 + radius * Math.sin(angle)).toFixed(1)}`);
    }
    return svg("polygon", { class: "bookmark-star", points: points.join(" ") });
  }

  /** Lays out and draws every Node again (after the tree changed). */
  function rebuild() {
    layout = layoutTree(model);
    shapes.clear();
    const edgeShapes = [];
    const boxShapes = [];
    for (const { node, depth, position, setSize } of model.ordered()) {
      const place = layout.places.get(node.id);
      const box = boxFor(node, place, depth, position, setSize);
      let edge = null;
      if (node.parent_id) {
        edge = svg("path", { class: "edge", d: edgePath(layout.places.get(node.parent_id), place) });
        edgeShapes.push(edge);
      }
      boxShapes.push(box);
      shapes.set(node.id, { box, edge });
    }
    edges.replaceChildren(...edgeShapes);
    boxes.replaceChildren(...boxShapes);
    const keep = selectedId;
    selectedId = null;
    onPath = new Set();
    if (keep) select(keep);
  }

  function select(id, { focus = false } = {}) {
    const previous = shapes.get(selectedId);
    if (previous) {
      previous.box.classList.remove("selected");
      previous.box.setAttribute("aria-selected", "false");
      previous.box.setAttribute("tabindex", "-1");
    }
    for (const pathId of onPath) {
      const shape = shapes.get(pathId);
      shape?.box.classList.remove("on-path");
      shape?.edge?.classList.remove("on-path");
    }
    selectedId = id;
    onPath = new Set(model.path(id).map((node) => node.id));
    for (const pathId of onPath) {
      const shape = shapes.get(pathId);
      shape?.box.classList.add("on-path");
      shape?.edge?.classList.add("on-path");
      // Drawn last, so the highlighted path lies over the other edges.
      if (shape?.edge) edges.append(shape.edge);
    }
    const shape = shapes.get(id);
    if (!shape) return;
    shape.box.classList.add("selected");
    shape.box.setAttribute("aria-selected", "true");
    shape.box.setAttribute("tabindex", "0");
    reveal(id);
    if (focus) shape.box.focus({ preventScroll: true });
  }

  function update(id) {
    const shape = shapes.get(id);
    const node = model.node(id);
    if (!shape || !node) return;
    shape.box.querySelector("text").textContent = boxText(node);
    shape.box.setAttribute("aria-label", boxLabel(node));
  }

  function focusSelected() {
    shapes.get(selectedId)?.box.focus({ preventScroll: true });
  }

  // Drag to pan; a press that does not move is a click on the box under it.
  let drag = null;
  canvas.addEventListener("pointerdown", (event) => {
    if (event.button !== 0) return;
    drag = { x: event.clientX, y: event.clientY, startX: view.x, startY: view.y, moved: false, id: event.pointerId };
  });
  canvas.addEventListener("pointermove", (event) => {
    if (!drag || event.pointerId !== drag.id) return;
    const dx = event.clientX - drag.x;
    const dy = event.clientY - drag.y;
    if (!drag.moved && Math.hypot(dx, dy) < 4) return;
    if (!drag.moved) {
      drag.moved = true;
      canvas.setPointerCapture(event.pointerId);
      canvas.classList.add("dragging");
    }
    view.x = drag.startX + dx;
    view.y = drag.startY + dy;
    applyView();
  });
  const endDrag = (event) => {
    if (!drag || event.pointerId !== drag.id) return;
    const moved = drag.moved;
    drag = null;
    canvas.classList.remove("dragging");
    if (canvas.hasPointerCapture(event.pointerId)) canvas.releasePointerCapture(event.pointerId);
    if (moved || event.type !== "pointerup") return;
    const box = event.target.closest?.(".gnode");
    if (box) onSelect(box.dataset.nodeId, { focus: true });
  };
  canvas.addEventListener("pointerup", endDrag);
  canvas.addEventListener("pointercancel", endDrag);
  canvas.addEventListener(
    "wheel",
    (event) => {
      event.preventDefault();
      const box = canvas.getBoundingClientRect();
      zoomAt(Math.exp(-event.deltaY * 0.0015), event.clientX - box.left, event.clientY - box.top);
    },
    { passive: false }
  );
  boxes.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" && event.key !== " ") return;
    const box = event.target.closest(".gnode");
    if (!box) return;
    event.preventDefault();
    onSelect(box.dataset.nodeId, { focus: true });
  });

  /** Called once the element is in the page (the frame has a size): shows the selected Node. */
  function shown() {
    view.scale = ZOOM.readable;
    centreOn(selectedId ?? model.rootId);
  }

  applyView();
  return { element, rebuild, select, update, focusSelected, shown, view, fit };
}
