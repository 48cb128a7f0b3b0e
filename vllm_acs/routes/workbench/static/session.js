// Sign in and out. The key lives in sessionStorage (this tab), or in localStorage only when the
// user ticks "Remember on this device"; it never goes into a URL, a log or the page's markup.

import { createClient, describeError } from "./api.js";
import { el } from "./dom.js";

const STORAGE_KEY = "vllm-acs.api-key";

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

/** Checks a key against the node (a wrong, paused or revoked key is refused there). */
export async function checkKey(key) {
  const client = createClient(key);
  const models = await client.request("GET", "/v1/models");
  return { client, models: models.data };
}

/** The sign-in form; calls onSignedIn({client, models}) once the node accepts the key. */
export function renderSignIn(main, onSignedIn) {
  const field = el("input", {
    id: "api-key",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
  });
  const remember = el("input", { id: "remember-key", type: "checkbox" });
  const error = el("p", { class: "error", role: "alert", hidden: true });
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
  main.replaceChildren(form);
  field.focus();
}
