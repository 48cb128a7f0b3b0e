"""Activation data shared by the API server and the workers: codec, per-request payload, store.

Pure numpy and the standard library: no torch, vLLM, web or storage imports (tests hold this).
The API server, per capture/steer request: build `AcsPayload` (payload.py) with a unique
`capture_id`, send `payload.to_extra_args()` as `vllm_xargs`; once vLLM returned the final output,
`store.read_capture(...)` (capture) or `store.check_applied(...)` (steer only) with
n_rows = prompt tokens + generated tokens - 1, `codec.encode_bits(rows)` for the response, and
`store.release(capture_id)` however the request ended.
"""
