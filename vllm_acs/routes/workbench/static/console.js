// The operator's console (#/console/<section>[/<account>]), for a key with the `admin` scope: its
// sections, each a module of its own over /v1/admin (docs/admin-console.md): Applications,
// Accounts, Keys, Usage, Nodes and the Audit log. Any other key is refused by the API (403
// scope_denied), and the page says so.

import { el } from "./dom.js";

const SECTIONS = [
  { name: "applications", title: "Applications", load: () => import("./console-applications.js") },
  { name: "accounts", title: "Accounts", load: () => import("./console-accounts.js") },
  { name: "keys", title: "Keys", load: () => import("./console-keys.js") },
  { name: "usage", title: "Usage", load: () => import("./console-usage.js") },
  { name: "nodes", title: "Nodes", load: () => import("./console-nodes.js") },
  { name: "audit", title: "Audit log", load: () => import("./console-audit.js") },
];

export async function mount(main, context) {
  const [wanted, account] = context.params;
  const section = SECTIONS.find((s) => s.name === wanted) ?? SECTIONS[0];
  const nav = el(
    "nav",
    { class: "console-nav", "aria-label": "Console" },
    SECTIONS.map((s) =>
      el("a", { href: `#/console/${s.name}`, "aria-current": s === section ? "page" : null }, s.title),
    ),
  );
  const box = el("div", { class: "console-section" });
  main.replaceChildren(
    el(
      "div",
      { class: "account-page console-page" },
      el(
        "div",
        { class: "console-head" },
        el("h1", {}, "Console"),
        el("p", { class: "hint" }, "Run this deployment: review applications, accounts, keys and budgets, read usage, nodes and the audit log. Every action here is written to the audit log under this key."),
      ),
      nav,
      box,
    ),
  );
  const module = await section.load();
  return module.mount(box, { ...context, account: account ? decodeURIComponent(account) : null });
}
