// Whether each model in use is warm, from `GET /v1/models/{id}/status` ({id, warm, nodes}): the
// models asked for are polled every POLL_MS while the view is mounted, and each listener hears
// its model's `warm` (null while unknown, or when the status cannot be read).

export const POLL_MS = 10_000;

export function createModelStatus(client) {
  const warm = new Map(); // model id -> true | false | null
  const listeners = new Set();
  let timer = null;
  let models = () => [];

  async function poll(ids) {
    await Promise.all(
      ids.map(async (id) => {
        let value = null;
        try {
          const status = await client.request("GET", `/v1/models/${encodeURIComponent(id)}/status`);
          value = Boolean(status.warm);
        } catch {
          value = null; // unknown: say nothing rather than guess
        }
        if (warm.get(id) !== value) {
          warm.set(id, value);
          for (const listener of listeners) listener(id, value);
        }
      })
    );
  }

  return {
    /** `modelsInUse()` names the models to poll; call once after mounting. */
    start(modelsInUse) {
      models = modelsInUse;
      poll([...new Set(models())]);
      timer = setInterval(() => poll([...new Set(models())]), POLL_MS);
    },
    /** Polls one model now (a lane's model changed). */
    check(id) {
      if (id) poll([id]);
    },
    warm: (id) => warm.get(id) ?? null,
    listen(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    stop() {
      clearInterval(timer);
      listeners.clear();
    },
  };
}
