#!/usr/bin/env bash
# Installs Debian's nginx when the machine has none: the request-window tests run a node behind
# it (tests/nginx.py starts its own nginx in a temp dir; no daemon, no service is started here).
# Idempotent: safe to run before every `make test`.
set -euo pipefail

if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
  exit 0
fi
echo "ensure-nginx: installing nginx-light"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
# The package's own service is not wanted: policy-rc.d 101 tells invoke-rc.d not to start it.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
  "${sudo_cmd[@]}" chmod +x "$policy"
  made_policy=1
fi
cleanup() { if [ "$made_policy" = 1 ]; then "${sudo_cmd[@]}" rm -f "$policy"; fi; }
trap cleanup EXIT
if ! "${sudo_cmd[@]}" apt-get install -y --no-install-recommends nginx-light; then
  "${sudo_cmd[@]}" apt-get update
  "${sudo_cmd[@]}" apt-get install -y --no-install-recommends nginx-light
fi
/usr/sbin/nginx -v
