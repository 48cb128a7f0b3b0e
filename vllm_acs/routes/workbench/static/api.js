// The node's public API as the page calls it: every request carries the signed-in key and
// `X-Acs-Workload: interactive`; every failure becomes an ApiError with the spec's code, message
// and the X-Request-Id, whatever answered (the envelope, an SSE `error` event, the network).

const WORKLOAD_HEADER = "X-Acs-Workload";

export class ApiError extends Error {
  constructor({ status = 0, code = "network_error", message, requestId = null, retryAfter = null, param = null }) {
    super(message);
    this.param = param;
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.requestId = requestId;
    this.retryAfter = retryAfter;
  }

  /** One line for a person: the code, the message, and the id to quote in a report. */
  describe() {
    const id = this.requestId ? ` (request ${this.requestId})` : "";
    return `${this.code}: ${this.message}${id}`;
  }
}

/** Any failure as one line for a person: an ApiError described, anything else its message. */
export function describeError(error) {
  return error instanceof ApiError ? error.describe() : String(error?.message ?? error);
}

export function isAbort(error) {
  return error?.name === "AbortError";
}

function headersFor(key, extra = {}) {
  const headers = { [WORKLOAD_HEADER]: "interactive", ...extra };
  // A client without a key calls only the routes that answer without one (the application form).
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

async function errorFrom(response) {
  const requestId = response.headers.get("x-request-id");
  const retryAfter = response.headers.get("retry-after");
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  const envelope = body?.error ?? {};
  return new ApiError({
    status: response.status,
    code: envelope.code ?? `http_${response.status}`,
    message: envelope.message || response.statusText || "The node answered an error.",
    requestId,
    retryAfter,
    param: envelope.param ?? null,
  });
}

function networkError(error) {
  if (isAbort(error)) return error;
  return new ApiError({ message: `The node could not be reached: ${error.message}` });
}

/** An API client bound to one key (or to none: `createClient(null)`, for the keyless routes). */
export function createClient(key) {
  async function send(method, path, { body, signal, headers = {} } = {}) {
    const init = { method, headers: headersFor(key, headers), signal };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      throw networkError(error);
    }
    if (!response.ok) throw await errorFrom(response);
    return response;
  }

  /** A JSON call: the parsed answer (null for 204). */
  async function request(method, path, options = {}) {
    const response = await send(method, path, options);
    if (response.status === 204) return null;
    const text = await response.text();
    return text ? JSON.parse(text) : null;
  }

  /** A text call (a CSV export): the answer's text. */
  async function requestText(method, path, options = {}) {
    const response = await send(method, path, options);
    return response.text();
  }

  /**
   * A streamed call (`stream: true` in the body): calls onEvent({event, data}) per SSE event,
   * data parsed as JSON ("[DONE]" stays a string). An `error` event or an `{error}` payload
   * rejects with its ApiError; aborting the signal rejects with an AbortError. onOpen({headers,
   * requestId}) is called once the answer starts, before its first event.
   */
  async function stream(path, body, { signal, onEvent, onOpen, headers = {} } = {}) {
    const response = await send("POST", path, { body, signal, headers });
    const requestId = response.headers.get("x-request-id");
    onOpen?.({ headers: response.headers, requestId });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        let chunk;
        try {
          chunk = await reader.read();
        } catch (error) {
          throw networkError(error);
        }
        if (chunk.done) break;
        buffer += decoder.decode(chunk.value, { stream: true });
        let end;
        while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
          const raw = buffer.slice(0, end);
          buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
          const event = parseEvent(raw);
          if (!event) continue;
          const envelope = event.event === "error" ? event.data?.error ?? event.data : event.data?.error;
          if (envelope && typeof envelope === "object") {
            throw new ApiError({
              status: response.status,
              code: envelope.code ?? "stream_error",
              message: envelope.message ?? "The stream ended with an error.",
              requestId,
            });
          }
          onEvent?.(event);
        }
      }
    } finally {
      reader.releaseLock();
    }
    return { requestId };
  }

  return { key, request, requestText, stream };
}

function parseEvent(raw) {
  let event = "message";
  const data = [];
  for (const line of raw.split(/\r?\n/)) {
    if (line.startsWith(":")) continue; // a keepalive comment
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (data.length === 0) return null;
  const text = data.join("\n");
  if (text === "[DONE]") return { event, data: text };
  try {
    return { event, data: JSON.parse(text) };
  } catch {
    return { event, data: text };
  }
}
