"""An account's keys and usage, framework-free: the key manager that the operator's
`vllm-acs keys` commands and the /v1/keys routes share, and the usage report of /v1/usage."""
