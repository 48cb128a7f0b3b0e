// The sign-in page's way in for a person without a key: "Apply for access" (shown only while the
// node's form is open: GET /v1/applications/form answers 200) and "I have a claim code". The
// claim code is shown once, when the application is sent; the page keeps it in localStorage only
// when the person ticks the box. Claiming it (in the body, never in a URL) answers the first API
// key once an operator approved the application. These three routes are called without a key.

import { ApiError, createClient, describeError } from "./api.js";
import { copyControls, el, formatTime } from "./dom.js";

const CLAIM_STORAGE_KEY = "vllm-acs.claim-code";
const FIELDS = [
  { name: "name", label: "Name", type: "text", autocomplete: "name" },
  { name: "email", label: "Email", type: "email", autocomplete: "email" },
  { name: "affiliation", label: "Affiliation", type: "text", autocomplete: "organization" },
];
// A refused claim in plain words; the node's own message follows it.
const CLAIM_ANSWERS = {
  application_pending: "Your application is awaiting review. Come back later with the same claim code: it works once the operator approves it.",
  application_rejected: "Your application was not approved.",
  application_expired: "Your application expired before it was claimed. You can apply again.",
  claim_code_used: "This claim code was used already: its API key was shown once, when it was claimed. If the key is lost, ask the operator for a new one.",
  invalid_claim_code: "This is not a claim code of this node. Check that it was copied whole.",
};
// These answers mean the code will never work again: a kept copy is forgotten.
const CODE_IS_SPENT = new Set(["application_rejected", "application_expired", "claim_code_used"]);

export function keptClaimCode() {
  return localStorage.getItem(CLAIM_STORAGE_KEY);
}

function keepClaimCode(code) {
  localStorage.setItem(CLAIM_STORAGE_KEY, code);
}

function forgetClaimCode() {
  localStorage.removeItem(CLAIM_STORAGE_KEY);
}

/**
 * The card under the sign-in form. onClaimed(created) gets the claim's answer (its `key` holds the
 * new secret) once the node handed the key out.
 */
export function createAccessCard(onClaimed) {
  const keyless = createClient(null);
  const card = el("section", { class: "card access-card", "aria-labelledby": "access-title" });
  let form = null; // GET /v1/applications/form, once it answered 200

  function home() {
    const applyButton = el("button", { type: "button", class: "primary", onclick: showApplyForm }, "Apply for access");
    const claimButton = el("button", { type: "button", onclick: () => showClaim() }, "I have a claim code");
    card.replaceChildren(
      el("h2", { id: "access-title" }, form ? "New here?" : "Applied for access?"),
      form
        ? el(
            "p",
            { class: "hint" },
            "This node is a research preview. Apply for access: the operator reviews each application, and once it is approved you sign in here with the claim code you get now.",
          )
        : el("p", { class: "hint" }, "Sign in with the claim code your application gave you."),
      el("div", { class: "access-actions" }, form ? applyButton : null, claimButton),
    );
  }

  function showClaim(message = null) {
    const code = el("input", {
      id: "claim-code",
      type: "password",
      autocomplete: "off",
      spellcheck: "false",
      required: true,
      maxlength: "100",
      value: keptClaimCode() ?? "",
    });
    const answer = el("div", { class: "claim-answer", hidden: true });
    const submit = el("button", { type: "submit", class: "primary" }, "Claim my key");
    const back = el("button", { type: "button", onclick: home }, "Back");
    const claimForm = el(
      "form",
      { class: "access-form", "aria-labelledby": "access-title" },
      el("h2", { id: "access-title" }, "Sign in with a claim code"),
      el(
        "p",
        { class: "hint" },
        "Your application gave you a claim code. Once the operator approves the application, it hands out your first API key, once.",
      ),
      el("label", { for: code.id }, "Claim code"),
      code,
      keptClaimCode() ? el("p", { class: "hint" }, "The claim code kept in this browser is filled in.") : null,
      answer,
      el("div", { class: "access-actions" }, submit, back),
    );
    claimForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const value = code.value.trim();
      if (!value) return;
      answer.hidden = true;
      submit.disabled = true;
      submit.textContent = "Claiming…";
      let claimed;
      try {
        claimed = await keyless.request("POST", "/v1/applications/claim", { body: { claim_code: value } });
        forgetClaimCode();
        code.value = "";
      } catch (error) {
        showClaimRefusal(answer, error);
        if (error instanceof ApiError && CODE_IS_SPENT.has(error.code)) forgetClaimCode();
      } finally {
        submit.disabled = false;
        submit.textContent = "Claim my key";
      }
      if (!claimed) return;
      try {
        await onClaimed(claimed);
      } catch (error) {
        showKeyHere(claimed, error); // the key is handed out once: never lose it to a failed sign-in
      }
    });
    card.replaceChildren(claimForm);
    if (message) showClaimRefusal(answer, message);
    code.focus();
  }

  function showClaimRefusal(box, error) {
    const plain = error instanceof ApiError ? CLAIM_ANSWERS[error.code] : null;
    const waiting = error instanceof ApiError && error.code === "application_pending";
    box.className = waiting ? "claim-answer notice" : "claim-answer error";
    box.setAttribute("role", waiting ? "status" : "alert");
    box.replaceChildren(
      el("p", { class: "claim-plain" }, plain ?? "The claim did not go through."),
      el("p", { class: "claim-detail" }, `The node answered ${describeError(error)}`),
    );
    box.hidden = false;
  }

  function showKeyHere(claimed, error) {
    const secret = el("input", { id: "claimed-key", type: "text", readonly: true, value: claimed.key.key, class: "secret", spellcheck: "false" });
    card.replaceChildren(
      el("h2", { id: "access-title" }, "Your API key"),
      el(
        "div",
        { class: "new-key" },
        el("p", { class: "warning", role: "note" }, "Copy this key now: it will not be shown again. Then sign in with it above."),
        el("div", { class: "secret-row" }, el("label", { for: secret.id }, "Your new API key"), secret),
      ),
      el("p", { class: "error", role: "alert" }, `Signing in with it failed: ${describeError(error)}`),
    );
    secret.focus();
    secret.select();
  }

  function showApplyForm() {
    const error = el("p", { class: "error", role: "alert", hidden: true });
    const inputs = {};
    const rows = FIELDS.map((field) => {
      const bounds = form.fields[field.name] ?? {};
      const input = el("input", {
        id: `apply-${field.name}`,
        name: field.name,
        type: field.type,
        autocomplete: field.autocomplete,
        required: true,
        maxlength: bounds.max_length,
      });
      inputs[field.name] = input;
      return el("div", { class: "field" }, el("label", { for: input.id }, field.label), input);
    });
    const useBounds = form.fields.intended_use ?? {};
    const use = el("textarea", {
      id: "apply-intended_use",
      name: "intended_use",
      rows: "5",
      required: true,
      minlength: useBounds.min_length,
      maxlength: useBounds.max_length,
      "aria-describedby": "apply-use-hint",
    });
    inputs.intended_use = use;
    const submit = el("button", { type: "submit", class: "primary" }, "Send application");
    const applyForm = el(
      "form",
      { class: "access-form", "aria-labelledby": "access-title" },
      el("h2", { id: "access-title" }, "Apply for access"),
      el("p", { class: "hint" }, "The operator reads every answer before approving. Nothing here is public."),
      el("div", { class: "access-fields" }, rows),
      el(
        "div",
        { class: "field" },
        el("label", { for: use.id }, "What do you want to do?"),
        use,
        el(
          "span",
          { class: "field-hint", id: "apply-use-hint" },
          `What you will study, and with which models (${useBounds.min_length ?? 20} to ${useBounds.max_length ?? 4000} characters).`,
        ),
      ),
      error,
      el("div", { class: "access-actions" }, submit, el("button", { type: "button", onclick: home }, "Cancel")),
    );
    applyForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      error.hidden = true;
      for (const input of Object.values(inputs)) input.removeAttribute("aria-invalid");
      const body = Object.fromEntries(Object.entries(inputs).map(([name, input]) => [name, input.value.trim()]));
      submit.disabled = true;
      try {
        const sent = await keyless.request("POST", "/v1/applications", { body });
        showClaimCode(sent);
      } catch (failure) {
        error.textContent = applyRefusal(failure);
        error.hidden = false;
        const field = failure instanceof ApiError ? inputs[failure.param] : null;
        if (field) {
          field.setAttribute("aria-invalid", "true");
          field.focus();
        }
      } finally {
        submit.disabled = false;
      }
    });
    card.replaceChildren(applyForm);
    inputs.name.focus();
  }

  function showClaimCode(sent) {
    const code = el("input", { id: "new-claim-code", type: "text", readonly: true, value: sent.claim_code, class: "secret", spellcheck: "false" });
    const [copy, copied] = copyControls(code, sent.claim_code, "code");
    const keep = el("input", { id: "keep-claim-code", type: "checkbox" });
    keep.addEventListener("change", () => (keep.checked ? keepClaimCode(sent.claim_code) : forgetClaimCode()));
    card.replaceChildren(
      el("h2", { id: "access-title" }, "Application sent"),
      el(
        "div",
        { class: "new-key" },
        el("h3", {}, "Your claim code"),
        el(
          "p",
          { class: "warning", role: "note" },
          "This code is shown this once, and it is the only way to collect your API key. Copy it, or keep it in this browser.",
        ),
        el("div", { class: "secret-row" }, el("label", { for: code.id }, "Claim code"), code, copy, copied),
        el("label", { class: "check" }, keep, " Keep the claim code in this browser"),
      ),
      el("h3", { class: "next-title" }, "What happens next"),
      el(
        "ol",
        { class: "next-steps" },
        el("li", {}, "The operator reviews your application. Until then, the claim code answers that it is awaiting review."),
        el("li", {}, "Once it is approved, come back to this page, choose ", el("strong", {}, "I have a claim code"), " and claim your key."),
        el("li", {}, "Your first API key is shown once, on the API keys page, and you are signed in with it. The claim code then stops working."),
      ),
      el("p", { class: "hint" }, `An application not claimed by ${formatTime(sent.expires_at)} expires.`),
      el("button", { type: "button", onclick: home }, "Done"),
    );
    code.focus();
    code.select();
  }

  // Shown once the node said whether its form is open, so the card does not change under the
  // reader; at once when a claim code is kept here (claims work whether the form is open or not).
  card.hidden = true;
  if (keptClaimCode()) {
    card.hidden = false;
    showClaim();
  }
  keyless
    .request("GET", "/v1/applications/form")
    .then(
      (answer) => {
        form = answer?.open ? answer : null;
      },
      () => {}, // closed (404 applications_closed) or unreachable: no form to offer
    )
    .finally(() => {
      if (!card.hidden) return;
      card.hidden = false;
      home();
    });
  return card;
}

function applyRefusal(error) {
  if (!(error instanceof ApiError)) return describeError(error);
  if (error.code === "rate_limited") {
    const minutes = error.retryAfter ? Math.ceil(Number(error.retryAfter) / 60) : null;
    return `Too many applications came from this address${minutes ? `; try again in ${minutes} minutes` : ""}. (${error.describe()})`;
  }
  if (error.code === "applications_full") {
    return `The waiting list is full: no more applications until the operator has reviewed some. (${error.describe()})`;
  }
  if (error.code === "applications_closed") return `This node no longer takes applications. (${error.describe()})`;
  return error.describe();
}
