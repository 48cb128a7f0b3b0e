#!/usr/bin/env bash
# Installs Debian's Chromium when the machine has none: the browser tests drive it headless with
# Playwright for Python (launched at /usr/bin/chromium; Playwright never downloads a browser).
# Idempotent: safe to run before every `make test`.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  exit 0
fi
echo "ensure-chromium: installing chromium"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo_cmd[@]}" apt-get install -y --no-install-recommends chromium fonts-dejavu-core; then
  "${sudo_cmd[@]}" apt-get update
  "${sudo_cmd[@]}" apt-get install -y --no-install-recommends chromium fonts-dejavu-core
fi
/usr/bin/chromium --version
