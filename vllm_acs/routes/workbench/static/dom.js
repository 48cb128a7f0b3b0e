// Small DOM helpers: elements are built with properties and text, never from HTML strings, so no
// text a model or a user wrote can become markup.

/**
 * el("button", {type: "button", class: "primary", onclick: fn}, "Run") -> <button>.
 * Attributes: `class`, `hidden`/`disabled`/`checked`/`required` (booleans), `on<event>` handlers,
 * `dataset` (an object), anything else as an attribute. Children: nodes, strings, or null.
 */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(node.dataset, value);
    } else if (name === "value") {
      node.value = value;
    } else if (value === true) {
      node.setAttribute(name, "");
    } else {
      node.setAttribute(name, String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** True when the keyboard focus is in a place where letters are typed (hotkeys must not fire). */
export function typingInField(target = document.activeElement) {
  if (!target || target === document.body) return false;
  if (target.isContentEditable) return true;
  const tag = target.tagName;
  if (tag === "TEXTAREA" || tag === "SELECT") return true;
  if (tag !== "INPUT") return false;
  return !["checkbox", "radio", "button", "submit", "range", "reset"].includes(target.type);
}

/** Formats Unix seconds or an ISO string as a short local date and time. */
export function formatTime(value) {
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  return date.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

/** A "Copy" button for a secret shown once in `input` (a read-only field), and the status line
 * beside it: copied, or how to copy it by hand where the clipboard is refused. `what` names it. */
export function copyControls(input, text, what) {
  const status = el("span", { class: "hint", role: "status" });
  const button = el(
    "button",
    {
      type: "button",
      class: "primary",
      onclick: async () => {
        try {
          await navigator.clipboard.writeText(text);
          status.textContent = "Copied.";
        } catch {
          input.select();
          status.textContent = `Select the ${what} and copy it with Ctrl+C.`;
        }
      },
    },
    "Copy",
  );
  return [button, status];
}
