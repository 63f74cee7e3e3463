# Helpers for elastic-volume (eVol) scenarios: two gimbal-targets of two
# namespaces each, three etcd members, arbiters, the pool, eVol configs
# for ublk-nvmf. Source after lib.sh, gimbal.sh and etcd.sh.

EVOL_NQN=nqn.2026-01.io.gimbal:evol
EVOL_EPS="127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379"
EVOL_PREFIX=/evol-vm

# evol_target_conf N [BACKEND]: /tmp/etN.toml, target N on 127.0.0.1:442N
# with two namespaces of 64 MiB (32 extents each): `sim` (the default,
# memory: gone with the process) or `file` (/tmp/etN-nsM.img on the
# guest's tmpfs: outlives the process, as a drive's data would).
evol_target_conf() {
    {
        cat <<EOC
listen = ["127.0.0.1:442$1"]
[[subsystem]]
nqn = "$EVOL_NQN"
serial = "EVOL000$1"
allow_any_host = true
EOC
        for _ns in 1 2; do
            echo "[[subsystem.namespace]]"
            echo "nsid = $_ns"
            echo "backend = \"${2:-sim}\""
            [ "${2:-sim}" = file ] && echo "path = \"/tmp/et$1-ns$_ns.img\""
            echo "size = \"64MiB\""
        done
    } >"/tmp/et$1.toml"
}

# evol_target_start N: starts target N (daemon tN) from /tmp/etN.toml
# and waits until it listens.
evol_target_start() {
    start_daemon "t$1" gimbal-target run --config "/tmp/et$1.toml"
    wait_for "target $1 listens" 20 gimbal_listening 442"$1"
}

# evol_target N [BACKEND]: writes target N's config and starts it.
evol_target() {
    evol_target_conf "$@"
    evol_target_start "$1"
}

# evol_arbiter ID PORT: arbiter ID (daemon arb-ID) on 127.0.0.1:PORT.
evol_arbiter() {
    cat >"/tmp/arb-$1.toml" <<EOC
id = "$1"
listen = "127.0.0.1:$2"
[etcd]
endpoints = [$(etcd_endpoints)]
prefix = "$EVOL_PREFIX"
lease_ttl = 4
EOC
    start_daemon "arb-$1" evol-arbiter run --config "/tmp/arb-$1.toml"
}

# arb ARGS...: an admin command to the leader. Every admin command is
# bounded: one that hangs fails its check instead of stalling the
# scenario until the VM's limit.
arb() { timeout 60 evol-arbiter "$@" --endpoints "$EVOL_EPS" --prefix "$EVOL_PREFIX"; }

# leader_is ID: the leader's status names ID ("arbiter ID: leading; ...").
leader_is() { arb status 2>/dev/null | grep -q "^arbiter $1: leading"; }

# check_map: `evol-arbiter check` (etcd alone; exit 1 on any finding).
check_map() { timeout 60 evol-arbiter check --endpoints "$EVOL_EPS" --prefix "$EVOL_PREFIX"; }

# evol_pool_add: the four namespaces t1n1, t1n2, t2n1, t2n2 (target tN,
# nsid M) into the pool, each a check.
evol_pool_add() {
    for _t in 1 2; do
        for _n in 1 2; do
            check "pool add t${_t}n$_n" arb pool add --id "t${_t}n$_n" --target "t$_t" \
                --address "127.0.0.1:442$_t" --subnqn "$EVOL_NQN" --nsid $_n
        done
    done
    check_output "the pool lists four namespaces of 32 extents" "^t2n2 +t2 .* 32 +0 +32$" arb pool list
}

# evol_volume_conf NAME [CTRL_LOSS_TMO]: /tmp/NAME.toml, a ublk-nvmf
# config for eVol NAME (a member unreachable for longer than
# CTRL_LOSS_TMO seconds, default 120, is given up until restart).
evol_volume_conf() {
    cat >"/tmp/$1.toml" <<EOC
name = "$1"
[evol]
alloc_wait = 60
[host]
nqn = "nqn.2026-01.io.test:evol-host"
id = "00000000-0000-4000-8000-0000000000e1"
[io]
queues = 1
queue_depth = 64
io_timeout = 30
[reconnect]
reconnect_delay = 1
ctrl_loss_tmo = ${2:-120}
[cluster]
endpoints = [$(etcd_endpoints)]
prefix = "$EVOL_PREFIX"
lease_ttl = 6
EOC
}

# evol_dev NAME: the device `status` names ("volume NAME: /dev/ublkbN -> ...").
evol_dev() { ublk-nvmf status "$1" | sed -n "s|^volume $1: \(/dev/ublkb[0-9]*\) .*|\1|p"; }

# evol_copy_targets NAME: one line per mapped extent of eVol NAME, from
# the records in etcd: its index, then the target of each copy (the pool
# record of the copy's namespace names it; "?" for a namespace that is
# not in the pool).
evol_copy_targets() {
    _pool=$(etcd_values "$EVOL_PREFIX/pool/") || { echo "etcd: reading the pool failed" >&2; return 1; }
    _pool=$(echo "$_pool" | grep '"target":' |
        sed -n 's/.*"id":"\([^"]*\)".*"target":"\([^"]*\)".*/\1 \2/p')
    [ -n "$_pool" ] || { echo "no pool records in etcd" >&2; return 1; }
    _recs=$(etcd_values "$EVOL_PREFIX/evols/$1/extents/") || { echo "etcd: reading the extents failed" >&2; return 1; }
    echo "$_recs" | while read -r _rec; do
        [ -n "$_rec" ] || continue
        _line=$(echo "$_rec" | sed -n 's/.*"index":\([0-9]*\).*/\1/p')
        for _ns in $(echo "$_rec" | grep -o '"namespace":"[^"]*"' | cut -d'"' -f4); do
            _t=$(echo "$_pool" | awk -v ns="$_ns" '$1 == ns { print $2 }')
            _line="$_line ${_t:-?}"
        done
        echo "$_line"
    done
}

# evol_copies_on_distinct_targets NAME EXTENTS COPIES: every one of the
# EXTENTS extents of eVol NAME is mapped with COPIES copies, each on a
# different target; prints every extent that is not.
evol_copies_on_distinct_targets() {
    _lines=$(evol_copy_targets "$1") || return 1
    echo "$_lines" | awk -v want="$2" -v k="$3" '
        NF == 0 { next }
        {
            n++
            delete seen; d = 0
            for (i = 2; i <= NF; i++) if (!($i in seen) && $i != "?") { seen[$i] = 1; d++ }
            if (NF - 1 != k || d != k) { bad++; print "extent " $1 ": copies on targets", substr($0, length($1) + 2) }
        }
        END {
            print n + 0, "extents mapped,", bad + 0, "without", k, "copies on distinct targets"
            exit (n == want && bad == 0) ? 0 : 1
        }'
}
