// One run: a streamed POST /v1/completions of a prompt and a sampler config, which its Stop
// cancels (a closed stream aborts the engine's request; only what was delivered is charged).
//
// A run the key's budget cannot fit is refused, never shortened: it sends
// `X-Acs-Budget-Clamp: refuse`, so the node answers `429 budget_exceeded` (saying how many tokens
// the budget still holds) before the engine sees the request, and nothing is charged
// (docs/decisions.md, "The Workbench").

import { ApiError, isAbort } from "./api.js";
import { fromCompletionLogprobs } from "./heatmap.js";
import { drawSeed, requestFields } from "./sampler.js";

export const REFUSE_CLAMP = { "X-Acs-Budget-Clamp": "refuse" };

/**
 * Starts a run. Returns {result, stop}: `result` resolves (never rejects) to
 * {state: "done" | "stopped" | "failed", text, tokens, seed, checkpoint, finishReason, requestId,
 *  error: ApiError | null}; onUpdate(partial) is called as text arrives.
 */
export function startRun(client, prompt, config, { onUpdate, onOpen } = {}) {
  const controller = new AbortController();
  const seed = config.seed ?? drawSeed();
  const run = {
    state: "running",
    text: "",
    tokens: [],
    seed,
    seedAuto: config.seed === null || config.seed === undefined,
    checkpoint: null,
    finishReason: null,
    requestId: null,
    error: null,
  };

  async function go() {
    try {
      await client.stream("/v1/completions", requestFields({ ...config, seed }, prompt), {
        signal: controller.signal,
        headers: REFUSE_CLAMP,
        onOpen: ({ requestId }) => {
          run.requestId = requestId;
          onOpen?.(run);
        },
        onEvent: ({ data }) => {
          if (data === "[DONE]" || !data?.choices) return;
          run.checkpoint = data.model ?? run.checkpoint;
          for (const choice of data.choices) {
            run.text += choice.text ?? "";
            if (choice.logprobs) run.tokens.push(...fromCompletionLogprobs(choice.logprobs));
            if (choice.finish_reason) run.finishReason = choice.finish_reason;
          }
          onUpdate?.(run);
        },
      });
      run.state = "done";
    } catch (error) {
      if (isAbort(error)) {
        run.state = "stopped";
      } else {
        run.state = "failed";
        run.error = error instanceof ApiError ? error : new ApiError({ message: String(error) });
        run.requestId = run.error.requestId ?? run.requestId;
      }
    }
    return run;
  }

  return { run, result: go(), stop: () => controller.abort() };
}
