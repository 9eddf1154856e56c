# Shared by scripts/cluster-up, cluster-down and the scripts that use the node: names, addresses and
# small helpers. Sourced, not run.
# shellcheck shell=bash
state="${LC_NODE_DIR:-/var/lib/load-control-node}"
netns="${LC_NODE_NETNS:-lc-node}"
api_port="${LC_NODE_API_PORT:-16443}"
pg_port="${LC_NODE_PG_PORT:-15432}"
node_name=lc-node
node_ip=10.77.0.1
pod_cidr=10.88.0.0/16
service_cidr=10.96.0.0/16
containerd_sock="$state/containerd/containerd.sock"
pause_image=load-control-pause:1

log() { echo "${LC_LOG_PREFIX:-cluster}: $*" >&2; }

# Runs a command in the node's network namespace. `nsenter --net`, not `ip netns exec`: the latter
# mounts a fresh /sys in a new mount namespace, hiding the cgroup hierarchy from kubelet and runc.
in_ns() { nsenter --net="/run/netns/$netns" "$@"; }

pid_alive() { [ -f "$state/pids/$1.pid" ] && kill -0 "$(cat "$state/pids/$1.pid")" 2>/dev/null; }

# start_in_ns NAME CMD ARGS...: a node process in its own session, logging to logs/NAME.log.
start_in_ns() {
  local name=$1; shift
  setsid nsenter --net="/run/netns/$netns" "$@" > "$state/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$state/pids/$name.pid"
}

# start_forwarder NAME HOSTPORT TARGET: 127.0.0.1:HOSTPORT on the host -> TARGET inside the namespace.
start_forwarder() {
  local name=$1 port=$2 target=$3
  local host=${target%:*} tport=${target##*:}
  setsid socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" \
    "EXEC:nsenter --net=/run/netns/$netns socat STDIO TCP\\:$host\\:$tport" \
    > "$state/logs/forward-$name.log" 2>&1 < /dev/null &
  echo $! > "$state/pids/forward-$name.pid"
}

# wait_for WHAT SECONDS PREDICATE: polls the predicate every 0.5 s, fails with the logs' tails.
wait_for() {
  local what=$1 limit=$2; shift 2
  local deadline=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "timed out after ${limit}s waiting for $what; last log lines:"
      for f in "$state"/logs/*.log; do echo "--- $f" >&2; tail -n 5 "$f" >&2; done
      return 1
    fi
    for p in "$state"/pids/*.pid; do
      local n; n=$(basename "$p" .pid)
      if ! kill -0 "$(cat "$p")" 2>/dev/null; then
        log "$n exited while waiting for $what:"; tail -n 20 "$state/logs/$n.log" >&2; return 1
      fi
    done
    sleep 0.5
  done
}

kubectl_node() { "$(cat "$state/bin")/kubectl" --kubeconfig "$state/kubeconfig" "$@"; }
api_ready() { [ "$(kubectl_node get --raw /readyz 2>/dev/null)" = ok ]; }
node_ready() {
  kubectl_node get node "$node_name" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}
default_sa_ready() { kubectl_node -n default get serviceaccount default; }
ctr_node() { ctr -a "$containerd_sock" -n k8s.io "$@"; }
ctr_ready() { ctr -a "$containerd_sock" version; }
# Reads a docker-archive on stdin (or a path) and imports it into the node's containerd.
ctr_import() { ctr_node images import --no-unpack=false "${1:--}" >/dev/null; }

node_running() {
  [ -f "$state/env" ] && pid_alive kube-apiserver && pid_alive kubelet && pid_alive containerd \
    && pid_alive forward-api && api_ready && node_ready
}

write_env() {
  local bin; bin=$(cat "$state/bin")
  cat > "$state/env" <<EOF
# Written by scripts/cluster-up: source it to use the node.
export KUBECONFIG=$state/kubeconfig
export KUBECTL=$bin/kubectl
export HELM=$bin/helm
export LC_NODE_DIR=$state
export LC_NODE_NETNS=$netns
export LC_NODE_NETNS_PATH=/run/netns/$netns
export LC_NODE_IP=$node_ip
export LC_NODE_CONTAINERD_SOCK=$containerd_sock
# PostgreSQL of the node: from the host (through the forwarder) and from pods.
export LC_NODE_PG_URL=postgres://postgres@127.0.0.1:$pg_port/postgres
export LC_NODE_PG_URL_IN_CLUSTER=postgres://postgres@$node_ip:5432/postgres
EOF
}
