# Helpers for a real etcd cluster inside the guest (Debian's etcd-server,
# copied into the image by initramfs.sh): three members on loopback.
# Source after lib.sh.

# Member N (0..2) listens for clients on 127.0.0.1:2N379 (2379, 12379,
# 22379) and for peers on 2N380.
etcd_client_port() { echo $(($1 * 10000 + 2379)); }
etcd_peer_port() { echo $(($1 * 10000 + 2380)); }

# etcd_endpoints: the TOML list of the members' client addresses.
etcd_endpoints() {
    echo "\"127.0.0.1:2379\", \"127.0.0.1:12379\", \"127.0.0.1:22379\""
}

_etcd_initial() {
    echo "m0=http://127.0.0.1:2380,m1=http://127.0.0.1:12380,m2=http://127.0.0.1:22380"
}

# etcd_member N new|existing: starts member N as daemon etcdN.
etcd_member() {
    _c=$(etcd_client_port "$1") _p=$(etcd_peer_port "$1")
    start_daemon "etcd$1" etcd --name "m$1" --data-dir "/tmp/etcd-m$1" \
        --listen-client-urls "http://127.0.0.1:$_c" \
        --advertise-client-urls "http://127.0.0.1:$_c" \
        --listen-peer-urls "http://127.0.0.1:$_p" \
        --initial-advertise-peer-urls "http://127.0.0.1:$_p" \
        --initial-cluster "$(_etcd_initial)" --initial-cluster-state "$2" \
        --initial-cluster-token vm --heartbeat-interval 200 --election-timeout 2000
}

# etcd_healthy: true once the cluster elected a leader (a member's
# /health says so).
etcd_healthy() {
    for _n in 0 1 2; do
        wget -q -O - "http://127.0.0.1:$(etcd_client_port $_n)/health" 2>/dev/null |
            grep -q '"health":"true"' && return 0
    done
    return 1
}

# etcd_start: the three members, waiting for a leader.
etcd_start() {
    for _n in 0 1 2; do etcd_member $_n new; done
    wait_for "etcd has a leader" 60 etcd_healthy
}

# etcd_kill N: SIGKILL member N.
etcd_kill() { stop_daemon "etcd$1" KILL; }

# etcd_restart N: member N again, on its data directory.
etcd_restart() { etcd_member "$1" existing; }

# --- reading keys through etcd's JSON gateway (no etcdctl in the guest) ---

# _etcd_post PATH JSON: POSTs to the first member that answers.
_etcd_post() {
    for _n in 0 1 2; do
        wget -q -O - --post-data "$2" "http://127.0.0.1:$(etcd_client_port $_n)$1" 2>/dev/null && return 0
    done
    return 1
}

# _etcd_b64 STRING
_etcd_b64() { printf %s "$1" | base64 | tr -d '\n'; }

# _etcd_prefix_range PREFIX: the range request's JSON for every key under
# PREFIX, which must end in "/" (the range ends at "0", the byte after it).
_etcd_prefix_range() {
    case "$1" in */) ;; *) echo "etcd: prefix $1 does not end in /" >&2; return 1 ;; esac
    echo "\"key\":\"$(_etcd_b64 "$1")\",\"range_end\":\"$(_etcd_b64 "${1%/}0")\""
}

# etcd_revision: the cluster's current revision (a range read returns it
# in the header).
etcd_revision() {
    _etcd_post /v3/kv/range '{"key":"AA==","limit":1}' |
        grep -o '"revision":"[0-9]*"' | head -n1 | grep -o '[0-9]*'
}

# etcd_count PREFIX: how many keys lie under PREFIX (a failed read prints
# nothing and fails).
etcd_count() {
    _r=$(_etcd_prefix_range "$1") || return 1
    _out=$(_etcd_post /v3/kv/range "{$_r,\"count_only\":true}") || return 1
    # proto3 JSON leaves zero counts out.
    _c=$(echo "$_out" | grep -o '"count":"[0-9]*"' | grep -o '[0-9][0-9]*')
    echo "${_c:-0}"
}

# etcd_values PREFIX: the values of the keys under PREFIX, one a line, in
# key order (our records are one-line JSON).
etcd_values() {
    _r=$(_etcd_prefix_range "$1") || return 1
    _out=$(_etcd_post /v3/kv/range "{$_r}") || return 1
    for _v in $(echo "$_out" | grep -o '"value":"[^"]*"' | cut -d'"' -f4); do
        echo "$_v" | base64 -d
        echo
    done
}
