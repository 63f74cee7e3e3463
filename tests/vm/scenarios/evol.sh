# vm-timeout: 1500
# Elastic volumes (issue 18): eVols of 2 MiB extents over the namespaces of
# two gimbal-targets (`sim` backends), placed by the elected evol-arbiter,
# served by ublk-nvmf; etcd (three members) holds the pool, the maps and
# the leadership.
# 1. An eVol over four namespaces on two targets: verified fio; its
#    extents are spread over all four; `evol-arbiter check` is clean.
# 2. Reads of never-written extents are zeros; a write maps its extent.
# 3. Warm: I/O that touches only mapped extents writes nothing to etcd
#    (the revision does not move; lease keep-alives are not writes).
# 4. The leading arbiter SIGKILLed during a burst of first writes: the
#    standby takes over, fio sees no error, `check` finds no extent mapped
#    twice, and a verify pass reads back every block.
# Throughput against the namespaces spanned (K = 1, 2, 4) is a bench:
# tests/vm/benches/evol-scaling.sh (timed results do not belong in tests).
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/etcd.sh

require_cmd ublk-nvmf gimbal-target evol-arbiter fio etcd wget || exit 1
require_module ublk_drv || exit 1

NQN=nqn.2026-01.io.gimbal:evol
EPS="127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379"
PREFIX=/evol-vm

# sim_target N: target N on 127.0.0.1:442N with two `sim` namespaces of
# 64 MiB (32 extents each).
sim_target() {
    cat >"/tmp/et$1.toml" <<EOC
listen = ["127.0.0.1:442$1"]
[[subsystem]]
nqn = "$NQN"
serial = "EVOL000$1"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "sim"
size = "64MiB"
[[subsystem.namespace]]
nsid = 2
backend = "sim"
size = "64MiB"
EOC
    start_daemon "t$1" gimbal-target run --config "/tmp/et$1.toml"
    wait_for "target $1 listens" 20 gimbal_listening 442"$1"
}

# arbiter ID PORT: arbiter ID (daemon arb-ID) on 127.0.0.1:PORT.
arbiter() {
    cat >"/tmp/arb-$1.toml" <<EOC
id = "$1"
listen = "127.0.0.1:$2"
[etcd]
endpoints = [$(etcd_endpoints)]
prefix = "$PREFIX"
lease_ttl = 4
EOC
    start_daemon "arb-$1" evol-arbiter run --config "/tmp/arb-$1.toml"
}
# Every admin command is bounded: one that hangs fails its check instead of
# stalling the scenario until the VM's limit.
arb() { timeout 60 evol-arbiter "$@" --endpoints "$EPS" --prefix "$PREFIX"; }
# leader_is ID: the leader's status names ID ("arbiter ID: leading; ...").
leader_is() { arb status 2>/dev/null | grep -q "^arbiter $1: leading"; }
check_map() { timeout 60 evol-arbiter check --endpoints "$EPS" --prefix "$PREFIX"; }

# volume_conf NAME: a ublk-nvmf config for eVol NAME.
volume_conf() {
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
ctrl_loss_tmo = 120
[cluster]
endpoints = [$(etcd_endpoints)]
prefix = "$PREFIX"
lease_ttl = 6
EOC
}
# dev_of NAME: the device `status` names ("volume NAME: /dev/ublkbN -> ...").
dev_of() { ublk-nvmf status "$1" | sed -n "s|^volume $1: \(/dev/ublkb[0-9]*\) .*|\1|p"; }

# etcd_revision: the cluster's current revision (a range read through
# etcd's JSON gateway returns it in the header).
etcd_revision() {
    wget -q -O - --post-data '{"key":"AA==","limit":1}' http://127.0.0.1:2379/v3/kv/range |
        grep -o '"revision":"[0-9]*"' | head -n1 | grep -o '[0-9]*'
}

sim_target 1 || exit 1
sim_target 2 || exit 1
etcd_start || exit 1
arbiter a 7451
wait_for "arbiter a leads" 30 leader_is a || exit 1
arbiter b 7452
wait_for "arbiter b listens" 20 gimbal_listening 7452
check_output "arbiter b stands by, naming a" "^arbiter b: standby; leader a at 127.0.0.1:7451" \
    timeout 60 evol-arbiter status --arbiter 127.0.0.1:7452

for t in 1 2; do
    for n in 1 2; do
        check "pool add t${t}n$n" arb pool add --id "t${t}n$n" --target "t$t" \
            --address "127.0.0.1:442$t" --subnqn "$NQN" --nsid $n
    done
done
check_output "the pool lists four namespaces of 32 extents" "^t2n2 +t2 .* 32 +0 +32$" arb pool list

# --- 1. an eVol over four namespaces: verified fio ---------------------------------
check "create ev4 (48 MiB, one copy)" arb volume create ev4 --size 48MiB --copies 1
volume_conf ev4
check_output "add the eVol" "^/dev/ublkb" ublk-nvmf add --config /tmp/ev4.toml || exit 1
DEV=$(dev_of ev4)
log "ev4 on $DEV"
check_eq "the device is the eVol's size" $((48 << 20)) "$(blockdev --getsize64 "$DEV")"

# 2. Before any write: zeros, and nothing mapped.
check_eq "a never-written extent reads as zeros" 0 \
    "$(dd if="$DEV" bs=1M count=2 skip=10 iflag=direct 2>/dev/null | tr -d '\0' | wc -c)"
check_output "reading mapped nothing" "evol ev4: 4 members, 0 extents mapped, 0 allocations" ublk-nvmf status ev4

fio_verify "fio verify randrw 4k..1M qd32 (first writes map extents)" "$DEV" randrw 4k 32 32M --bsrange=4k-1M
fio_verify "fio verify write 1M qd16 across every extent" "$DEV" write 1M 16 48M
for n in t1n1 t1n2 t2n1 t2n2; do
    check_output "extents were placed on $n" "^$n +t[12] .* 32 +[1-9][0-9]* +[0-9]+$" arb pool list
done
check "check: the maps are sound" check_map

# --- 3. warm: I/O on mapped extents writes nothing to etcd --------------------------
r0=$(etcd_revision)
fio_verify "fio verify randrw on mapped extents" "$DEV" randrw 16k 32 48M
sleep 3
r1=$(etcd_revision)
log "etcd revision $r0 -> $r1"
check "etcd revision read" test -n "$r0"
check_eq "no etcd write while I/O touched only mapped extents" "$r0" "$r1"

check "del ev4" ublk-nvmf del ev4

# --- 4. the leader SIGKILLed during a burst of first writes -------------------------
check "create evf (48 MiB)" arb volume create evf --size 48MiB --copies 1
volume_conf evf
check_output "add evf" "^/dev/ublkb" ublk-nvmf add --config /tmp/evf.toml || exit 1
DEVF=$(dev_of evf)
FIOF="--name=evf --filename=$DEVF --ioengine=libaio --direct=1 --rw=write --bs=256k \
    --iodepth=8 --size=48M --verify=crc32c --verify_fatal=1 --rate=4m"
fio $FIOF --do_verify=0 >"$LOGDIR/fio-evf.log" 2>&1 &
fio_pid=$!
sleep 3
check "SIGKILL the leading arbiter a" stop_daemon arb-a KILL
wait_for "arbiter b takes over" 30 leader_is b
wait $fio_pid
check_eq "fio across the failover: no error" 0 $?
grep -q "err= *0" "$LOGDIR/fio-evf.log" || tail -n 20 "$LOGDIR/fio-evf.log"
check "check: no physical extent mapped twice" check_map
check "verify pass reads back every block" fio $FIOF --rate=0 --verify_only
check_output "status: every extent mapped, none waiting" "evol evf: 4 members, 24 extents mapped, 24 allocations" ublk-nvmf status evf
check "del evf" ublk-nvmf del evf
check "arbiter b still up" daemon_alive arb-b
