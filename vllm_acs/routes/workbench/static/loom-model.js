// One Loom as the page holds it: the API's Loom (GET /v1/looms/{id}) indexed by Node id, each
// Node's children in order, the path from the root, and the live changes of a streamed branch.
// No DOM here: the List view, the Graph view and the centre panel all read the same model.

export class LoomModel {
  constructor(loom) {
    this.load(loom);
  }

  /** Takes a whole Loom answer (after any change the page reads the Loom again). */
  load(loom) {
    this.id = loom.id;
    this.title = loom.title ?? null;
    this.nodes = new Map(loom.nodes.map((node) => [node.id, { ...node, children: [...node.children] }]));
    this.rootId = loom.nodes.find((node) => node.parent_id === null)?.id ?? null;
  }

  node(id) {
    return this.nodes.get(id) ?? null;
  }

  get root() {
    return this.node(this.rootId);
  }

  parent(id) {
    const node = this.node(id);
    return node?.parent_id ? this.node(node.parent_id) : null;
  }

  children(id) {
    return (this.node(id)?.children ?? []).map((child) => this.node(child)).filter(Boolean);
  }

  /** The Node's siblings in order, itself included (the root is its own only sibling). */
  siblings(id) {
    const parent = this.parent(id);
    return parent ? this.children(parent.id) : [this.node(id)].filter(Boolean);
  }

  /** The Nodes from the root down to `id`, both included. */
  path(id) {
    const path = [];
    let node = this.node(id);
    while (node && path.length <= this.nodes.size) {
      path.push(node);
      node = node.parent_id ? this.node(node.parent_id) : null;
    }
    return path.reverse();
  }

  /** The text the model continues from `id`: every Node's text on its path (GET .../text). */
  pathText(id) {
    return this.path(id)
      .map((node) => node.text)
      .join("");
  }

  /** Every Node in tree order (pre-order, siblings in order), with its depth and place. */
  ordered() {
    const rows = [];
    if (!this.root) return rows;
    const stack = [{ node: this.root, depth: 0, position: 1, setSize: 1 }];
    while (stack.length) {
      const row = stack.pop();
      rows.push(row);
      const children = this.children(row.node.id);
      for (let k = children.length - 1; k >= 0; k -= 1) {
        stack.push({ node: children[k], depth: row.depth + 1, position: k + 1, setSize: children.length });
      }
    }
    return rows;
  }

  /** How many Nodes a delete of `id` removes (itself and everything under it). */
  subtreeSize(id) {
    let count = 0;
    const stack = [id];
    while (stack.length) {
      const node = this.node(stack.pop());
      if (!node) continue;
      count += 1;
      stack.push(...node.children);
    }
    return count;
  }

  /** A streamed branch's `started`: its children, generating, appended under their parent. */
  addNodes(nodes) {
    for (const node of nodes) {
      this.nodes.set(node.id, { ...node, children: [...(node.children ?? [])] });
      const parent = this.node(node.parent_id);
      if (parent && !parent.children.includes(node.id)) parent.children.push(node.id);
    }
  }

  /** A streamed branch's `delta`: more text of one child. */
  appendText(id, text) {
    const node = this.node(id);
    if (node) node.text += text;
    return node;
  }
}

/** A Node's text on one line, shortened for a label (the tree rows, the graph's boxes). */
export function preview(text, length = 80) {
  const flat = text.replace(/\s+/g, " ").trim();
  if (!flat) return "(empty)";
  return flat.length > length ? `${flat.slice(0, length - 1)}…` : flat;
}

/** What a Node is, in a word a person reads. */
export function originLabel(node) {
  return (
    { root: "root", model: "model", human: "written", split: "split", import: "imported" }[node.origin] ?? node.origin
  );
}
