"""POST/GET /v1/keys, PATCH/DELETE /v1/keys/{key_id}: an account's keys, managed by a key with
the `keys` scope."""
