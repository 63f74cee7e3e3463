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
