#!/usr/bin/env bash
# Where a local GET's time goes inside the filter's VM (BENCHMARKS.md, "Per-request cost",
# "Inside the VM"). Builds the filter with bench/timing-probe.patch applied (a copy of the tree
# in target/timing-probe/src; the working tree is not touched): the request path reads the host
# clock between its steps and logs the mean of every 20,000 requests. Then runs it in Envoy
# (--concurrency 1, core 0) on the skewgate bootstrap (render-static, 1.30 local + 1.33 peer)
# in front of a static nginx, loads it with wrk on core 1 and prints the probe's lines.
#
#   bench/timing-probe.sh [SECONDS]      (default 20; installs what it needs, as scripts/bench)
#
# The clock reads are host calls themselves: "now" is what one costs, and every other step
# includes about one of them. Not a product build: never ship it.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
export PATH="$PWD/.tools/venv/bin:$PATH"
[ -x .tools/venv/bin/envoy ] || scripts/setup --without-compose-image
missing=()
for pkg in patch wrk nginx-light; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get install -y -qq "${missing[@]}" >&2 || { apt-get update -qq >&2 && apt-get install -y -qq "${missing[@]}" >&2; }
fi
dir=$PWD/target/timing-probe
rm -rf "$dir" && mkdir -p "$dir/src"
git ls-files -z | xargs -0 cp --parents -t "$dir/src"
(cd "$dir/src" && patch -s -p1 <"$OLDPWD/bench/timing-probe.patch")
(cd "$dir/src" && CARGO_TARGET_DIR="$dir/target" cargo build --locked -q -p skewgate-filter \
  --target wasm32-wasip1 --release)
wasm=$dir/target/wasm32-wasip1/release/skewgate_filter.wasm
cargo build --locked -q -p skewgate-control --bin skewgate-control

port=${BENCH_PORT:-17700}
a=$((port + 1)) b=$((port + 2)) admin=$((port + 3))
fixtures=$PWD/tests/fixtures/discovery
target/debug/skewgate-control render-static --local apiserver-a --out-dir "$dir/envoy" \
  --apiserver "id=apiserver-a,address=127.0.0.1:$a,discovery=$fixtures/k8s-1.30" \
  --apiserver "id=apiserver-b,address=127.0.0.1:$b,discovery=$fixtures/k8s-1.33" \
  --listen "127.0.0.1:$port" --wasm "$wasm" --insecure-tcp-local-channels --admin-port "$admin" \
  --insecure-plaintext-listener --insecure-plaintext-upstreams >/dev/null
cat >"$dir/nginx.conf" <<NGINX
worker_processes 1;
pid $dir/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  server { listen 127.0.0.1:$a; location / { default_type application/json; return 200 '{}'; } }
  server { listen 127.0.0.1:$b; location / { default_type application/json; return 200 '{}'; } }
}
NGINX
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
taskset -c 1 nginx -c "$dir/nginx.conf" -p "$dir" -e "$dir/nginx.log" -g 'daemon off;' &
pids+=("$!")
taskset -c 0 envoy -c "$dir/envoy/envoy.yaml" --disable-hot-restart --concurrency 1 -l warning \
  --log-path "$dir/envoy.log" >"$dir/envoy.out" 2>&1 &
pids+=("$!")
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$admin/ready" >/dev/null && break; sleep 0.2; done
url=http://127.0.0.1:$port/apis/apps/v1/namespaces/default/deployments/web
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url")" = 200 ] || { echo "the probe build does not answer 200" >&2; exit 1; }
taskset -c 1 wrk -t1 -c16 -d"${secs}s" "$url" | grep Requests/sec
kill "${pids[@]}"; wait 2>/dev/null || true
pids=()
grep -o 'PROBE.*' "$dir/envoy.log" | tail -5
