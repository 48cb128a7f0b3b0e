// One run: a streamed POST /v1/completions of a prompt and a sampler config, which its Stop
// cancels (a closed stream aborts the engine's request; only what was delivered is charged).
//
// A run the key's budget cannot fit is refused, never shortened: when the node lowers max_tokens
// to fit a budget it says so in `X-Acs-Max-Tokens-Clamped` before the first token, and the run
// closes its stream there and fails with `budget_exceeded` (docs/decisions.md, "The Workbench").

import { ApiError, isAbort } from "./api.js";
import { fromCompletionLogprobs } from "./heatmap.js";
import { drawSeed, requestFields } from "./sampler.js";

export const CLAMP_HEADER = "x-acs-max-tokens-clamped";

/** `requested=100,applied=12,reason=budget,source=request` as an object. */
export function parseClamp(value) {
  return Object.fromEntries(
    value.split(",").map((part) => {
      const [name, ...rest] = part.split("=");
      return [name.trim(), rest.join("=").trim()];
    })
  );
}

function budgetRefusal(clamp, requestId) {
  return new ApiError({
    status: 429,
    code: "budget_exceeded",
    message:
      `This run asks for up to ${clamp.requested} tokens; the key's budget fits only ` +
      `${clamp.applied}. The Workbench refuses the run rather than shorten it: lower Max tokens, ` +
      "or ask the operator for a larger budget.",
    requestId,
  });
}

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
  let refusal = null;

  async function go() {
    try {
      await client.stream("/v1/completions", requestFields({ ...config, seed }, prompt), {
        signal: controller.signal,
        onOpen: ({ headers, requestId }) => {
          run.requestId = requestId;
          const clamp = headers.get(CLAMP_HEADER);
          if (clamp) {
            refusal = budgetRefusal(parseClamp(clamp), requestId);
            controller.abort();
            return;
          }
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
      if (refusal) {
        run.state = "failed";
        run.error = refusal;
      } else if (isAbort(error)) {
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
