// Sign in and out. The key lives in sessionStorage (this tab), or in localStorage only when the
// user ticks "Remember on this device"; it never goes into a URL, a log or the page's markup.

import { createClient, describeError } from "./api.js";
import { createAccessCard } from "./apply.js";
import { el } from "./dom.js";

const STORAGE_KEY = "vllm-acs.api-key";
// A key just claimed with a claim code: the Dashboard shows its secret once, then forgets it. It
// lives in this module only (never in a URL or storage beyond the tab's sign-in).
let createdKey = null;

/** The key a claim just handed out ({id, name, prefix, key, ...}), once; null after that. */
export function takeCreatedKey() {
  const created = createdKey;
  createdKey = null;
  return created;
}

export function storedKey() {
  return sessionStorage.getItem(STORAGE_KEY) ?? localStorage.getItem(STORAGE_KEY);
}

function keep(key, remember) {
  forgetKey();
  (remember ? localStorage : sessionStorage).setItem(STORAGE_KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(STORAGE_KEY);
  localStorage.removeItem(STORAGE_KEY);
}

/** What the header shows of a key: its first characters, never the secret. */
export function keyLabel(key) {
  return `${key.slice(0, 10)}…`;
}

/** Checks a key against the node (a wrong, paused or revoked key is refused there), and asks
 * whether it holds the `admin` scope (the console's routes answer it; any other key gets 403). */
export async function checkKey(key) {
  const client = createClient(key);
  const [models, admin] = await Promise.all([client.request("GET", "/v1/models"), isAdmin(client)]);
  return { client, models: models.data, admin };
}

async function isAdmin(client) {
  try {
    await client.request("GET", "/v1/admin/nodes");
    return true;
  } catch {
    return false; // 403 scope_denied; anything else wrong the sign-in itself says
  }
}

/** The sign-in form and, under it, the way in without a key (apply, or claim a key with a claim
 * code); calls onSignedIn({client, models, admin, created}) once the node accepts the key. */
export function renderSignIn(main, onSignedIn) {
  const field = el("input", {
    id: "api-key",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
  });
  const remember = el("input", { id: "remember-key", type: "checkbox" });
  const error = el("p", { id: "sign-in-error", class: "error", role: "alert", hidden: true });
  const submit = el("button", { type: "submit", class: "primary" }, "Sign in");
  const form = el(
    "form",
    { class: "sign-in card", "aria-labelledby": "sign-in-title" },
    el("h1", { id: "sign-in-title" }, "Sign in"),
    el(
      "p",
      { class: "hint" },
      "Paste an API key of this node. The operator makes keys with ",
      el("code", {}, "vllm-acs keys create"),
      "; a node started with ",
      el("code", {}, "make serve"),
      " prints its local key."
    ),
    el("label", { for: "api-key" }, "API key"),
    field,
    el("label", { class: "check" }, remember, " Remember on this device"),
    error,
    submit
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = field.value.trim();
    if (!key) return;
    error.hidden = true;
    submit.disabled = true;
    submit.textContent = "Signing in…";
    try {
      const session = await checkKey(key);
      keep(key, remember.checked);
      field.value = "";
      onSignedIn(session);
    } catch (failure) {
      const shown = describeError(failure);
      error.textContent = shown;
      error.hidden = false;
      field.focus();
    } finally {
      submit.disabled = false;
      submit.textContent = "Sign in";
    }
  });
  const access = createAccessCard(async (claimed) => {
    const session = await checkKey(claimed.key.key);
    keep(claimed.key.key, false);
    createdKey = claimed.key;
    onSignedIn({ ...session, created: claimed.key });
  });
  main.replaceChildren(el("div", { class: "sign-in-page" }, form, access));
  field.focus();
}
