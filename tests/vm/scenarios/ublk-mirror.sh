# vm-timeout: 600
# A mirrored volume (issue 7): two gimbal-targets with file namespaces
# behind one /dev/ublkb0.
# 1. First start: replica 1 gets a full copy from replica 0 (a new
#    intent log), then both are in sync.
# 2. Reads spread over both replicas while both are healthy.
# 3. fio writes with crc32c verification headers; target 1 (replica 0) is
#    killed in the middle: no I/O error, the volume runs degraded.
# 4. Target 1 restarted: after its fence the replica resyncs the regions
#    it missed and is in sync again.
# 5. Target 2 stopped (SIGSTOP) under 1 MiB reads, whose data waits in
#    the kernel until all of it has arrived (SO_RCVLOWAT): the keep-alive
#    timeout resets its connections, and every read waiting on them comes
#    back and is served by replica 0, with the same data. Then target 2
#    is killed: a full verification pass of everything fio wrote still
#    succeeds, reading only replica 0, which proves it received the
#    writes it missed while it was down.
# 6. Bad replica sets are refused with a clear error: different sizes.
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/ublk.sh

require_cmd ublk-nvmf gimbal-target fio || exit 1
require_module ublk_drv || exit 1

NQN=nqn.2026-01.io.gimbal:mirror
# target_conf N SIZE: config of target N on port 442N with a file namespace.
target_conf() { gimbal_file_target_conf m "$1" "$NQN" "MIRROR000$1" "$2"; }
start_target() { gimbal_file_target_start m "$1"; }
target_conf 1 64MiB
target_conf 2 64MiB
start_target 1 || exit 1
start_target 2 || exit 1

cat >/tmp/mv.toml <<EOC
name = "mv"
[[replica]]
address = "127.0.0.1"
port = 4421
subnqn = "$NQN"
[[replica]]
address = "127.0.0.1"
port = 4422
subnqn = "$NQN"
[io]
queues = 1
queue_depth = 64
io_timeout = 5
[reconnect]
reconnect_delay = 1
ctrl_loss_tmo = 600
keep_alive_tmo = 2
[replication]
region_size = "1m"
resync_rate = "32m"
bitmap_dir = "/tmp/ublk-lib"
EOC

replica_state() { ublk-nvmf status mv | grep "replica $1:"; }
in_sync() { replica_state "$1" | grep -q ' in-sync '; }

# --- 1. first start: full copy to replica 1 -----------------------------------
check_output "add the mirrored volume" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/mv.toml || exit 1
ublk-nvmf status mv
wait_for "replica 1 copied in full and in sync" 240 in_sync 1 || {
    ublk-nvmf status mv
    tail -n 30 /run/ublk-nvmf/mv.log
}
check "replica 0 in sync" in_sync 0
ublk-nvmf status mv

# --- 2. reads spread -----------------------------------------------------------
check "fio randread 4k qd32 for 8 s" fio --name=spread --filename=/dev/ublkb0 --ioengine=libaio \
    --direct=1 --rw=randread --bs=4k --iodepth=32 --runtime=8 --time_based --size=64M
st=$(ublk-nvmf status mv --json)
r0=$(echo "$st" | grep -o '"reads":[0-9]*' | sed -n 2p | cut -d: -f2)
r1=$(echo "$st" | grep -o '"reads":[0-9]*' | sed -n 3p | cut -d: -f2)
log "reads served: replica 0 $r0, replica 1 $r1"
check "both replicas served reads" test "${r0:-0}" -gt 0 -a "${r1:-0}" -gt 0

# --- 3. writes while target 1 dies -----------------------------------------------
# 48 MiB of 16 KiB writes with verification headers, paced to ~25 s so the
# kill lands in the middle.
FIO_W="--name=mirror --filename=/dev/ublkb0 --ioengine=libaio --direct=1 --rw=write --bs=16k \
    --iodepth=16 --size=48M --verify=crc32c --verify_fatal=1"
fio $FIO_W --do_verify=0 --rate=2m >"$LOGDIR/fio-write.log" 2>&1 &
fio_pid=$!
sleep 6
check "target 1 killed (SIGKILL) during the writes" kill -9 "$(daemon_pid t1)"
wait_for "replica 0 out of sync" 30 sh -c "ublk-nvmf status mv | grep 'replica 0:' | grep -Eq ' (fencing|failed) '"
ublk-nvmf status mv
check "fio writes completed without an I/O error" wait "$fio_pid" || tail -n 20 "$LOGDIR/fio-write.log"
check_output "no errors counted" '"errors":0,' ublk-nvmf status mv --json
dirty=$(ublk-nvmf status mv | sed -n 's/.*replica 0: .*dirty regions \([0-9]*\).*/\1/p')
log "replica 0 missed writes to $dirty regions of 1 MiB"
# fio wrote ~2 MiB/s for the ~18 s after the kill, sequentially.
check "regions written after the kill recorded as missed by replica 0 ($dirty >= 8)" \
    test "${dirty:-0}" -ge 8

# --- 4. target 1 returns: fence, resync -------------------------------------------
check "target 1 restarted" start_target 1
wait_for "replica 0 resynced and in sync" 180 in_sync 0 || {
    ublk-nvmf status mv
    tail -n 30 /run/ublk-nvmf/mv.log
}
ublk-nvmf status mv
check_output "replica 0: no dirty regions left" 'replica 0: .*dirty regions 0' ublk-nvmf status mv
check_output "the resync was logged" 'replica 0 resynced' cat /run/ublk-nvmf/mv.log
check_output "the resync started with exactly the regions it missed" \
    "replica 0 is back; resyncing $dirty regions" cat /run/ublk-nvmf/mv.log
grep -E 'replica|resync|fence' /run/ublk-nvmf/mv.log | sed 's/^/    daemon: /'

# --- 5. target 2 stops, then dies: replica 0 alone must hold everything ---------------
# A stopped target's sockets stay open, so a read whose data it had
# half sent waits for the rest until the keep-alive timeout aborts the
# connection: the abort must wake it (a hang here hangs fio).
sum_of() { dd if=/dev/ublkb0 bs=1M count=48 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1; }
before=$(sum_of)
# Each writes a file when done (a finished child stays a zombie, which
# `kill -0` still finds, until the script waits for it).
rm -f /tmp/bigreads.rc /tmp/sum-during
(
    fio --name=bigreads --filename=/dev/ublkb0 --ioengine=libaio --direct=1 --rw=read --bs=1m \
        --iodepth=32 --runtime=10 --time_based --size=48M >"$LOGDIR/fio-bigreads.log" 2>&1
    echo $? >/tmp/bigreads.rc
) &
sleep 2
check "target 2 stopped (SIGSTOP) during 1 MiB reads" kill -STOP "$(daemon_pid t2)"
# A read pass that starts with target 2 stopped: its reads there wait
# for the reset too.
(sum_of >/tmp/sum-during.part && mv /tmp/sum-during.part /tmp/sum-during) &
wait_for "1 MiB reads finished with target 2 stopped" 90 sh -c 'test -e /tmp/bigreads.rc && test -e /tmp/sum-during'
check_output "1 MiB reads completed without an I/O error" "^0$" cat /tmp/bigreads.rc ||
    tail -n 20 "$LOGDIR/fio-bigreads.log"
check_output "a 1 MiB read pass during the stop read the same data ($before)" "^$before\$" cat /tmp/sum-during
check "target 2 killed (SIGKILL)" kill -9 "$(daemon_pid t2)"
check "a read after the kill still works" dd if=/dev/ublkb0 of=/dev/null bs=4096 count=16 iflag=direct
wait_for "replica 1 out of sync" 30 sh -c "ublk-nvmf status mv | grep 'replica 1:' | grep -Eq ' (fencing|failed) '"
check "full verification pass of the 48 MiB on replica 0 alone" fio $FIO_W --verify_only=1
check_output "still no errors counted" '"errors":0,' ublk-nvmf status mv --json
ublk-nvmf status mv
check "del mv" ublk-nvmf del mv
wait_for "/dev/ublkb0 removed" 20 sh -c '! test -e /dev/ublkb0'
check "intent log kept for the next start" test -s /tmp/ublk-lib/mv.bitmap

# --- 6. replicas of different sizes are refused --------------------------------------
stop_daemon t1
target_conf 2 32MiB
rm -f /tmp/m2.img
start_target 2 || exit 1
start_target 1 || exit 1
sed -i 's/name = "mv"/name = "mw"/' /tmp/mv.toml
check_output "replicas of different sizes: refused, naming both" 'replicas differ in size' \
    sh -c 'ublk-nvmf run --config /tmp/mv.toml 2>&1; true'
check "no device left behind" sh -c '! test -e /dev/ublkb0'
stop_daemon t1
stop_daemon t2
finish
