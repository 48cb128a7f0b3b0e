// Console: Applications. The applicant's answers, and for a pending one Approve (with the
// account's monthly token total) or Reject, each with an optional note. Newest first.

import { describeError } from "./api.js";
import { el } from "./dom.js";
import { badge, selectField, when } from "./console-common.js";

const STATUSES = [
  ["pending", "Pending review"],
  ["approved", "Approved, not claimed yet"],
  ["claimed", "Claimed"],
  ["rejected", "Rejected"],
  ["expired", "Expired"],
  ["all", "All"],
];

export function mount(box, context) {
  const { client } = context;
  const alert = el("p", { class: "error", role: "alert", hidden: true });
  const status = el("p", { class: "hint", role: "status" });
  const filter = selectField("applications-status", "Show", STATUSES, "pending");
  const list = el("div", { class: "applications" });
  box.replaceChildren(
    el("div", { class: "section-head" }, el("h2", {}, "Applications"), filter.row),
    alert,
    status,
    list,
  );
  filter.select.addEventListener("change", () => load());

  // Each load is numbered: an answer that arrives after a newer load was asked is dropped.
  let asked = 0;

  async function load() {
    const mine = ++asked;
    alert.hidden = true;
    try {
      const status = filter.select.value;
      const query = new URLSearchParams({ status, limit: "200" });
      const listed = await client.request("GET", `/v1/admin/applications?${query}`);
      if (mine !== asked) return;
      list.replaceChildren(
        ...(listed.data.length
          ? listed.data.map(card)
          : [el("p", { class: "empty card" }, status === "pending" ? "No application waits for review." : "No applications.")]),
      );
    } catch (error) {
      alert.textContent = describeError(error);
      alert.hidden = false;
    }
  }

  function card(application) {
    const titleId = `application-${application.id}`;
    const facts = el(
      "dl",
      { class: "account-facts" },
      el("dt", {}, "Email"),
      el("dd", {}, application.email),
      el("dt", {}, "Affiliation"),
      el("dd", {}, application.affiliation),
      el("dt", {}, "Applied"),
      el("dd", {}, when(application.created_at)),
      el("dt", {}, application.status === "pending" ? "Expires" : "Claim by"),
      el("dd", {}, when(application.expires_at)),
      application.decided_at ? [el("dt", {}, "Decided"), el("dd", {}, `${when(application.decided_at)} by ${application.decided_by}`)] : null,
      application.note ? [el("dt", {}, "Note"), el("dd", {}, application.note)] : null,
      application.claimed_at ? [el("dt", {}, "Claimed"), el("dd", {}, `${when(application.claimed_at)} (key ${application.key_id})`)] : null,
    );
    return el(
      "article",
      { class: "card application", "aria-labelledby": titleId, dataset: { status: application.status } },
      el("div", { class: "application-head" }, el("h3", { id: titleId }, application.name), badge(application.status)),
      el(
        "div",
        { class: "application-body" },
        el("div", {}, el("h4", {}, "What they want to do"), el("p", { class: "intended-use" }, application.intended_use)),
        facts,
      ),
      application.status === "pending" ? decision(application) : null,
    );
  }

  function decision(application) {
    const id = application.id;
    const monthly = el("input", { id: `monthly-${id}`, type: "number", min: "0", step: "1", inputmode: "numeric" });
    const note = el("input", { id: `note-${id}`, type: "text", maxlength: "500", autocomplete: "off" });
    const approve = el("button", { type: "button", class: "primary", "aria-label": `Approve ${application.name}` }, "Approve");
    const reject = el("button", { type: "button", class: "danger", "aria-label": `Reject ${application.name}` }, "Reject");
    async function decide(action) {
      alert.hidden = true;
      const body = {};
      if (note.value.trim()) body.note = note.value.trim();
      if (action === "approve" && monthly.value !== "") body.monthly_tokens = Number(monthly.value);
      approve.disabled = reject.disabled = true;
      try {
        await client.request("POST", `/v1/admin/applications/${encodeURIComponent(id)}/${action}`, { body });
        status.textContent = `${application.name}'s application is ${action === "approve" ? "approved: they can claim their key now" : "rejected"}.`;
        await load();
      } catch (error) {
        alert.textContent = describeError(error);
        alert.hidden = false;
        approve.disabled = reject.disabled = false;
      }
    }
    approve.addEventListener("click", () => decide("approve"));
    reject.addEventListener("click", () => decide("reject"));
    return el(
      "div",
      { class: "decision", role: "group", "aria-label": `Decide on ${application.name}` },
      el("div", { class: "field" }, el("label", { for: monthly.id }, "Monthly tokens for the account (optional)"), monthly),
      el("div", { class: "field field-note" }, el("label", { for: note.id }, "Note (optional)"), note),
      approve,
      reject,
    );
  }

  load();
}
