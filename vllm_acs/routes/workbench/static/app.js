// The page shell: sign-in, the top navigation, and the views behind the hash routes
//   #/            the Workbench (Single / Compare)      workbench.js
//   #/loom        the list of Looms                     loom.js
//   #/loom/<id>   one Loom                              loom.js
//   #/dashboard   the account's keys                    dashboard.js
//   #/usage       this key's budgets and tokens         usage.js
//   #/console/<section>[/<account>]  the operator's console (admin keys)  console.js
// A view module exports mount(main, context) and may return {unmount()}; context holds the API
// client, the models (default first), the route's parameters and navigate(hash).

import { ApiError } from "./api.js";
import { checkKey, forgetKey, keyLabel, renderSignIn, storedKey } from "./session.js";

const VIEWS = [
  { pattern: /^#\/console(?:\/([a-z]+)(?:\/([^/]+))?)?\/?$/, name: "console", load: () => import("./console.js") },
  { pattern: /^#\/dashboard\/?$/, name: "dashboard", load: () => import("./dashboard.js") },
  { pattern: /^#\/usage\/?$/, name: "usage", load: () => import("./usage.js") },
  { pattern: /^#\/loom\/([^/]+)$/, name: "loom", load: () => import("./loom.js") },
  { pattern: /^#\/loom\/?$/, name: "loom", load: () => import("./loom.js") },
  { pattern: /^(#\/?)?$/, name: "workbench", load: () => import("./workbench.js") },
];

const main = document.getElementById("main");
let session = null; // {client, models, admin}
let current = null; // the mounted view's {unmount}
let navigations = 0; // counts route() calls: only the newest may mount

/** The models with the default first (`GET /v1/models` order otherwise). */
function sortModels(models) {
  return [...models].sort((a, b) => Number(Boolean(b.default)) - Number(Boolean(a.default)));
}

function showFeedbackLink() {
  const meta = document.querySelector('meta[name="acs-feedback-url"]');
  const link = document.getElementById("feedback-link");
  if (!meta) return;
  link.href = meta.content;
  link.hidden = false;
}

function showSignedIn(signedIn) {
  document.getElementById("main-nav").hidden = !signedIn;
  document.getElementById("account").hidden = !signedIn;
  document.getElementById("key-label").textContent = signedIn ? `Key ${keyLabel(session.client.key)}` : "";
  // The console's link only for a key with the `admin` scope (its routes refuse any other key).
  document.getElementById("console-link").hidden = !(signedIn && session.admin);
}

function markCurrentLink(name) {
  for (const link of document.querySelectorAll("#main-nav a[data-view]")) {
    if (link.dataset.view === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

async function route() {
  if (!session) return;
  const navigation = ++navigations;
  const hash = location.hash;
  const view = VIEWS.find((v) => v.pattern.test(hash)) ?? VIEWS[VIEWS.length - 1];
  const params = hash.match(view.pattern)?.slice(1) ?? [];
  current?.unmount?.();
  current = null;
  markCurrentLink(view.name);
  // Each navigation mounts into a box of its own: a view still loading when the user moves on
  // finishes in its box, off the page, and is unmounted, instead of drawing over the next one.
  const box = document.createElement("div");
  box.className = "view";
  main.replaceChildren(box);
  const module = await view.load();
  // Moved on meanwhile: a newer route() runs, or the hash changed and its hashchange is queued.
  if (navigation !== navigations || location.hash !== hash) return;
  const context = {
    client: session.client,
    models: session.models,
    params,
    navigate: (target) => {
      if (location.hash === target) route();
      else location.hash = target;
    },
    signOut,
  };
  const mounted = (await module.mount(box, context)) ?? null;
  if (navigation !== navigations) mounted?.unmount?.();
  else current = mounted;
}

function signedIn(result) {
  session = { client: result.client, models: sortModels(result.models), admin: Boolean(result.admin) };
  showSignedIn(true);
  // A key just claimed opens on the keys page, where its secret is shown once.
  if (result.created && location.hash !== "#/dashboard") history.replaceState(null, "", "#/dashboard");
  route();
}

function signOut() {
  navigations += 1; // a view still loading must not mount over the sign-in form
  current?.unmount?.();
  current = null;
  forgetKey();
  session = null;
  showSignedIn(false);
  renderSignIn(main, signedIn);
}

async function start() {
  showFeedbackLink();
  document.getElementById("sign-out").addEventListener("click", signOut);
  window.addEventListener("hashchange", route);
  const key = storedKey();
  if (!key) {
    renderSignIn(main, signedIn);
    return;
  }
  try {
    signedIn(await checkKey(key));
  } catch (error) {
    // A key kept from before that the node no longer accepts: ask again, and say why.
    forgetKey();
    renderSignIn(main, signedIn);
    if (error instanceof ApiError) {
      const alert = document.getElementById("sign-in-error");
      alert.textContent = error.describe();
      alert.hidden = false;
    }
  }
}

start();
