# The real-apiserver suites' shared checks and requests (tests/compose/real/run,
# tests/compose/real/beside-upstream): sourced after tests/compose/lib.sh, with the cluster up
# (bring_up), `logs` and `prefix` set.

# kubectl in a node, straight to its apiserver on loopback (past Envoy), as kubernetes-admin.
kc_local() { # node args...
  local n=$1; shift
  docker exec -i "$(cid "$n")" kubectl --server https://127.0.0.1:6443 --certificate-authority /etc/kubernetes/pki/ca.crt \
    --client-certificate /etc/kubernetes/pki/admin.crt --client-key /etc/kubernetes/pki/admin.key --request-timeout=20s "$@"
}

ready=1
check_up() {
  local n bad=
  # The apiservers first: skewgate-control's user may read nothing until its RBAC is applied,
  # as on a kubeadm cluster (docs/install.md, "Installing on a kubeadm HA cluster").
  for n in 1 2 3; do
    wait_until 120 kc_local "node-$n" get --raw /readyz || bad+=" node-$n"
  done
  if [ -n "$bad" ]; then ready=; not_ok "every real kube-apiserver is ready" "not ready:$bad"; return; fi
  ok "every real kube-apiserver is ready ($(elapsed))"
  if out=$(kc_local node-1 apply -f - <deploy/kubeadm/rbac.yaml 2>&1); then
    ok "deploy/kubeadm/rbac.yaml applies on the real apiserver"
  else ready=; not_ok "deploy/kubeadm/rbac.yaml applies on the real apiserver" "$out"; return; fi
  for n in 1 2 3; do
    wait_until 90 bash -c "docker exec $(cid node-$n) curl -m 5 -fsS http://127.0.0.1:18002/debug/skew \
      | jq -e '([.apiservers[] | select(.local | not) | .consecutive_failures == 0] | length == 2 and all) and (.unrouted_peers | length == 0)'" \
      || bad+=" node-$n"
  done
  if [ -z "$bad" ]; then ok "every node's control plane has both peers' discovery, through their peer ports ($(elapsed))"
  else ready=; not_ok "every node's control plane has both peers' discovery" "not:$bad; $(docker exec "$n1" curl -m 5 -sS http://127.0.0.1:18002/debug/skew | jq -c '[.apiservers[] | {url, routed, consecutive_failures, last_error}]' 2>&1 | head -c 900)"; fi
}

# ---------------------------------------------------------------------------------------------
# Requests from the client container. Every curl sends an Audit-ID of its own: each apiserver
# keeps an audit log (kube-apiserver.args), so the suite can tell which apiserver served a
# request, and as whom, from the logs the apiservers themselves wrote.
pki_c=/skewgate/pki
# req USER NODE METHOD PATH [BODY-FILE-IN-CLIENT]: prints "<HTTP code> <audit id>"; the body is
# in the client's /tmp/body, the headers in /tmp/headers. USER: admin or alice.
req() {
  local user=$1 node=$2 method=$3 path=$4 body=${5:-} id
  id=$(cat /proc/sys/kernel/random/uuid)
  local args=(-sS -m 60 --cacert "$pki_c/ca.crt" --cert "$pki_c/$user.crt" --key "$pki_c/$user.key"
              -H "Audit-ID: $id" -X "$method" -D /tmp/headers -o /tmp/body -w '%{http_code}')
  [ -z "$body" ] || args+=(-H 'Content-Type: application/json' --data-binary "@$body")
  local code
  code=$(docker exec "$client" curl "${args[@]}" "https://$(node_ip "$node"):6443$path" 2>&1) || true
  echo "$code $id"
}
body() { docker exec "$client" cat /tmp/body; }
node_ip() { echo "$prefix.1${1#node-}"; }
# served_by AUDIT-ID: the nodes whose apiserver logged that request.
served_by() {
  local f n=
  for f in "$logs"/node-*-audit.log; do
    grep -q "\"auditID\":\"$1\"" "$f" 2>/dev/null && n+="${n:+ }$(basename "$f" -audit.log)"
  done
  echo "${n:-nobody}"
}
# audit_user AUDIT-ID: the user the apiserver that served it authenticated.
audit_user() { cat "$logs"/node-*-audit.log | grep -F "\"auditID\":\"$1\"" | jq -r '.user.username' | sort -u | tr '\n' ' ' | sed 's/ $//'; }
kc1() { docker exec -i "$client" kubectl --context node-1 --request-timeout=40s "$@"; }
skew() { docker exec "$(cid "$1")" curl -m 5 -fsS "http://127.0.0.1:18002/debug/skew${2:-}"; }
accept_v2='application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList'
