# vm-timeout: 1800
# Elastic volumes with two copies per extent (issue 18's acceptance: "with
# two copies per extent, one target SIGKILLed under verified writes: no
# error, resync on return"). Two gimbal-targets with two `file` namespaces
# each, three etcd members, one arbiter, one eVol of 48 MiB with
# copies = 2 served by ublk-nvmf.
#
# Why `file` (on the guest's tmpfs) and not `sim` as in `evol`: a killed
# target must come back with what it had acknowledged, as a drive would.
# `sim` and `ram` keep their data in the process, so a restarted one
# comes back empty under the same NGUID, and the client repairs only the
# copies it marked stale: every other copy on that target would read
# zeros, unnoticed. A `file` namespace outlives the process (the target
# writes to the file before it answers).
#
# 1. A sequential pass maps every extent; each extent's two copies are on
#    different targets (the extent and pool records in etcd); `check` is
#    clean.
# 2. Random writes (4k..1M, QD 32, crc32c headers) over the first 32 MiB
#    (extents 0-15) with target 1 SIGKILLed in the middle of them: fio
#    sees no error, its verify pass included; `status` counts stale copies
#    and etcd holds their marks (`PREFIX/evols/NAME/stale/L`), all on
#    target 1's namespaces, none beyond extent 15.
# 3. Target 1 back on the same port with the same files: the repair
#    brings the stale copies to 0 and deletes the marks; verify-only
#    passes read back every block (the random writes, and the last 16 MiB
#    as the first pass wrote them).
# 4. A flush, the last 16 MiB written again without one, then target 2
#    SIGKILLed: exactly those extents' copies on target 2 are marked stale
#    (its volatile cache may have lost them); every read comes from
#    target 1's copies, and the verify-only passes read back every block
#    again; `check` is clean; target 2 back, its copies are repaired.
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/etcd.sh
. /vm/evol.sh

require_cmd ublk-nvmf gimbal-target evol-arbiter fio etcd wget base64 || exit 1
require_module ublk_drv || exit 1

V=evc
STALE="$EVOL_PREFIX/evols/$V/stale/"

# stale_copies: the S of status' "evol NAME: N members, M extents mapped,
# A allocations, S stale copies".
stale_copies() { ublk-nvmf status $V | sed -n "s/^ *evol $V: .*, \([0-9][0-9]*\) stale copies$/\1/p"; }
stale_copies_are() { [ "$(stale_copies)" = "$1" ]; }
some_stale_copies() { _s=$(stale_copies) && [ -n "$_s" ] && [ "$_s" -gt 0 ]; }
# marks_are N / some_marks: stale marks in etcd.
marks_are() { [ "$(etcd_count "$STALE")" = "$1" ]; }
some_marks() { _k=$(etcd_count "$STALE") && [ -n "$_k" ] && [ "$_k" -gt 0 ]; }
# written_bytes: the volume's write bytes so far ("writes N (B bytes)").
written_bytes() { ublk-nvmf status $V | sed -n 's/.*, writes [0-9]* (\([0-9]*\) bytes).*/\1/p'; }
written_since() { _w=$(written_bytes) && [ -n "$_w" ] && [ $((_w - $1)) -ge "$2" ]; }
# json_field NAME: a number from `status --json`.
json_field() { ublk-nvmf status $V --json | grep -o "\"$1\":[0-9]*" | head -n1 | cut -d: -f2; }

# kill_target N: SIGKILLs target N, keeping its log for the failure dump.
kill_target() {
    stop_daemon "t$1" KILL
    mv "$LOGDIR/daemon-t$1.log" "$LOGDIR/daemon-t$1-killed.log"
    check_fails "target $1 no longer listens" gimbal_listening 442"$1"
}

evol_target 1 file || exit 1
evol_target 2 file || exit 1
etcd_start || exit 1
evol_arbiter a 7451
wait_for "arbiter a leads" 30 leader_is a || exit 1
evol_pool_add

check "create $V (48 MiB, two copies)" arb volume create $V --size 48MiB --copies 2
check_output "the volume list shows two copies" "^$V +50331648 +2 " arb volume list
# A target may stay down through the rest of fio's write phase and its
# verify pass: give up on a member (ctrl_loss_tmo) only long after that.
evol_volume_conf $V 900
check_output "add $V" "^/dev/ublkb" ublk-nvmf add --config /tmp/$V.toml || exit 1
DEV=$(evol_dev $V)
log "$V on $DEV"
check_eq "the device is the eVol's size" $((48 << 20)) "$(blockdev --getsize64 "$DEV")"

# --- 1. every extent mapped, its two copies on different targets -----------------
fio_verify "fio verify write 1M qd16 maps every extent" "$DEV" write 1M 16 48M
check_output "status: 24 extents mapped, no stale copy" \
    "evol $V: 4 members, 24 extents mapped, 24 allocations, 0 stale copies$" ublk-nvmf status $V
check "every extent has two copies, on different targets" evol_copies_on_distinct_targets $V 24 2
check "check: the maps are sound" check_map
# The targets' `file` namespaces report a volatile write cache: until a
# flush, a member that goes away may have lost what it acknowledged, and
# its copies would be marked stale. The flush makes the first pass
# durable on every member.
check "sync: a flush reaches every member" sync "$DEV"
check_output "status counts the flush" "flushes [1-9]" ublk-nvmf status $V

# --- 2. target 1 SIGKILLed under verified random writes ----------------------------
# One job definition for the write pass and the verify-only passes: the
# same seed replays the same offsets and sizes. The last 16 MiB keep the
# first pass's blocks (FIOT verifies them).
FIOJ="--name=$V --filename=$DEV --ioengine=libaio --direct=1 --rw=randwrite \
    --bsrange=4k-1M --iodepth=32 --size=32M --randseed=7157 \
    --verify=crc32c --verify_fatal=1"
FIOT="--name=tail --filename=$DEV --ioengine=libaio --direct=1 --rw=write \
    --bs=1M --iodepth=16 --offset=32M --size=16M --verify=crc32c --verify_fatal=1"
w0=$(written_bytes)
# Writes paced (reads are not) so the kill lands in the middle of them.
fio $FIOJ --do_verify=1 --rate=,3m >"$LOGDIR/fio-$V.log" 2>&1 &
fio_pid=$!
wait_for "the random writes are under way (8 MiB written)" 300 written_since "${w0:-0}" $((8 << 20))
check "fio is still writing when target 1 is killed" kill -0 $fio_pid
kill_target 1
wait_for "status counts stale copies (target 1's missed writes)" 120 some_stale_copies
wait_for "etcd holds stale marks under $STALE" 60 some_marks
wait $fio_pid
check_eq "fio across target 1's SIGKILL (writes and verify pass): exit 0" 0 $?
check "fio reports no I/O error" grep -q "err= *0" "$LOGDIR/fio-$V.log" ||
    tail -n 30 "$LOGDIR/fio-$V.log"
S=$(stale_copies)
K=$(etcd_count "$STALE")
log "with target 1 down: $S stale copies, $K stale marks in etcd"
check "status still counts stale copies" some_stale_copies
# With two copies and one target down, an extent has at most one stale
# copy: as many marks as copies, each naming a namespace of target 1.
check_eq "etcd holds one mark per stale copy" "$S" "$K"
check_eq "every mark names one copy, on target 1" "$K" \
    "$(etcd_values "$STALE" | grep -o '"namespace":"t1n[12]"' | wc -l)"
check_eq "the marks name no copy elsewhere" 0 \
    "$(etcd_values "$STALE" | grep -o '"namespace":"[^"]*"' | grep -vc '"t1n[12]"')"
check_eq "no mark beyond extent 15 (the random writes' range)" 0 \
    "$(etcd_values "$STALE" | grep -o '"index":[0-9]*' | cut -d: -f2 | awk '$1 > 15' | wc -l)"

# --- 3. target 1 back with its files: the stale copies are repaired ----------------
evol_target_start 1 || exit 1
wait_for "the repair brings the stale copies to 0" 600 stale_copies_are 0
wait_for "the stale marks are gone from etcd" 60 marks_are 0
check_eq "status --json: every stale copy repaired" "$S" "$(json_field repaired)"
check "verify pass: the random writes (both targets up)" fio $FIOJ --verify_only
check "verify pass: the last 16 MiB (both targets up)" fio $FIOT --verify_only

# --- 4. target 2 SIGKILLed with unflushed writes: reads come from target 1 ---------
# What is flushed stays in sync; the last 16 MiB, written again and not
# flushed, may be lost with target 2's cache: exactly those extents'
# copies there are marked stale when it goes (ExtentMap::member_lost).
check "sync: the random writes and the repair are durable" sync "$DEV"
check "rewrite the last 16 MiB (extents 16-23), not flushed" fio $FIOT
kill_target 2
wait_for "target 2's unflushed copies are marked stale" 120 some_stale_copies
wait_for "etcd holds their marks" 60 some_marks
check_eq "the marks name only target 2's copies" 0 \
    "$(etcd_values "$STALE" | grep -o '"namespace":"[^"]*"' | grep -vc '"t2n[12]"')"
check_eq "the marks are exactly extents 16-23 (the unflushed ones)" "16 17 18 19 20 21 22 23" \
    "$(etcd_values "$STALE" | grep -o '"index":[0-9]*' | cut -d: -f2 | sort -n | tr '\n' ' ' | sed 's/ $//')"
check "verify pass, target 2 down: the random writes, from target 1's repaired copies" \
    fio $FIOJ --verify_only
check "verify pass, target 2 down: the last 16 MiB, from target 1" fio $FIOT --verify_only
check "check: the maps are sound" check_map

# Target 2 back: its stale copies are repaired; then the volume goes.
evol_target_start 2 || exit 1
wait_for "the repair brings target 2's stale copies to 0" 600 stale_copies_are 0
wait_for "their marks are gone from etcd" 60 marks_are 0
check "verify pass, both up: the last 16 MiB" fio $FIOT --verify_only
check "del $V" ublk-nvmf del $V
check "arbiter a still up" daemon_alive arb-a
