# Sourced by bench/cluster.sh and bench/cluster-run.sh: private
# redis-servers on loopback TCP, one alone and three masters of a Cluster.
# Needs `work` (a temp dir) and `pids` (an array the caller's cleanup
# kills); sets `single` (its port) and `nodes` (the masters' ports).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # dir port [args...]
  local dir=$1 port=$2; shift 2
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" "$@" >/dev/null &
  pids+=($!)
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && return; sleep 0.05; done
  echo "redis-server on $port did not start" >&2; exit 1
}
start_single_and_cluster() {
  single=$(free_port); start "$work/single" "$single"
  nodes=()
  local i p
  for i in 0 1 2; do
    # the bus port explicitly: port + 10000 may not exist
    p=$(free_port); start "$work/node$i" "$p" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$(free_port)"
    nodes+=("$p")
  done
  redis-cli --cluster create $(printf '127.0.0.1:%s ' "${nodes[@]}") --cluster-replicas 0 --cluster-yes >/dev/null
  for _ in $(seq 200); do
    redis-cli -p "${nodes[0]}" cluster info | grep -q cluster_state:ok && break; sleep 0.05
  done
}
