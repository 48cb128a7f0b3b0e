// The Loom view: #/loom lists the key's Looms (loom-list.js), #/loom/<id> opens one
// (loom-page.js). app.js calls mount(main, context); the answer's unmount() runs on leaving.

import { mountList } from "./loom-list.js";
import { mountLoom } from "./loom-page.js";

export function mount(main, context) {
  const [loomId] = context.params;
  return loomId ? mountLoom(main, context, decodeURIComponent(loomId)) : mountList(main, context);
}
