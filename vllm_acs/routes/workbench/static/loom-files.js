// Files in and out of the browser: a download made from text (Export JSON, Export text) and a
// JSON file picked by the user (Import JSON). Nothing leaves the page but to the node's own API.

import { el } from "./dom.js";

/** Saves `text` as a file named `name` (a Blob URL, revoked once the download has started). */
export function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = el("a", { href: url, download: name, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** A file name made of a Loom's title: letters, digits and dashes. */
export function fileStem(title, fallback = "loom") {
  const stem = (title ?? "")
    .normalize("NFKD")
    .replace(/[^\w\s-]/g, "")
    .trim()
    .replace(/[\s_]+/g, "-")
    .toLowerCase()
    .slice(0, 60);
  return stem || fallback;
}

export class FileNotJson extends Error {}

/**
 * A hidden file field and a function that opens it: resolves with the picked file parsed as JSON
 * (null when the user picks nothing), or rejects with FileNotJson naming the file. A document
 * without a title (a socketteer/loom file has none) is given the file's name as its title.
 */
export function jsonFilePicker() {
  const input = el("input", { type: "file", accept: ".json,application/json", hidden: true, "aria-hidden": "true", tabindex: "-1" });
  function pick() {
    return new Promise((resolve, reject) => {
      input.value = "";
      input.onchange = async () => {
        const file = input.files?.[0];
        if (!file) return resolve(null);
        const text = await file.text();
        let document;
        try {
          document = JSON.parse(text);
        } catch (error) {
          reject(new FileNotJson(`${file.name} is not a JSON file: ${error.message}`));
          return;
        }
        if (document && typeof document === "object" && !Array.isArray(document) && !document.title) {
          document.title = file.name.replace(/(\.loom)?\.json$/i, "").slice(0, 200);
        }
        resolve(document);
      };
      input.oncancel = () => resolve(null);
      input.click();
    });
  }
  return { input, pick };
}
