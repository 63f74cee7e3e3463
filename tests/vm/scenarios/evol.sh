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
# Also: the client's view reports are accepted and the auction grants
# slices (the auction fails open while no arbiter answers: no error).
# Throughput against the namespaces spanned (K = 1, 2, 4) is a bench:
# tests/vm/benches/evol-scaling.sh (timed results do not belong in tests).
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/etcd.sh
. /vm/evol.sh

require_cmd ublk-nvmf gimbal-target evol-arbiter fio etcd wget || exit 1
require_module ublk_drv || exit 1

evol_target 1 || exit 1
evol_target 2 || exit 1
etcd_start || exit 1
evol_arbiter a 7451
wait_for "arbiter a leads" 30 leader_is a || exit 1
evol_arbiter b 7452
wait_for "arbiter b listens" 20 gimbal_listening 7452
check_output "arbiter b stands by, naming a" "^arbiter b: standby; leader a at 127.0.0.1:7451" \
    timeout 60 evol-arbiter status --arbiter 127.0.0.1:7452

evol_pool_add

# --- 1. an eVol over four namespaces: verified fio ---------------------------------
check "create ev4 (48 MiB, one copy)" arb volume create ev4 --size 48MiB --copies 1
evol_volume_conf ev4
check_output "add the eVol" "^/dev/ublkb" ublk-nvmf add --config /tmp/ev4.toml || exit 1
DEV=$(evol_dev ev4)
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
check "check --scan-data: every free extent reads as zeros" arb check --scan-data
# Flint's client side: the agent's aggregated reports reach the view (the
# arbiter accepted their vectors) and the auction granted slices.
check_output "the view accepts the client's reports, the auction grants slices" \
    "evol auction: .* [1-9][0-9]* slices granted, [0-9]* waits; view: [1-9][0-9]* reports \\([1-9][0-9]* vectors accepted\\)" \
    ublk-nvmf status ev4

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
evol_volume_conf evf
check_output "add evf" "^/dev/ublkb" ublk-nvmf add --config /tmp/evf.toml || exit 1
DEVF=$(evol_dev evf)
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
