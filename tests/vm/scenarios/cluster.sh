# vm-timeout: 1200
# Cluster mode (issue 17): a mirrored volume whose owner, fencing and
# replica health live in a real three-member etcd cluster in the guest.
# Two "hosts" are two ublk-nvmf servers with their own host NQN, run
# directory and state directory (bitmap); two gimbal-targets with file
# namespaces hold the replicas.
# 1. Attach race: both hosts add the volume at once; exactly one wins, the
#    other is told who owns it.
# 2. Owner paused (SIGSTOP) beyond its lease under verified writes: the
#    other host takes the volume over and runs verified fio; the first is
#    resumed: its writes fail with Reservation Conflict at the targets, it
#    stops serving, and a full verification pass on the new owner succeeds.
# 3. Owner killed while a replica is out of sync: the other host starts
#    the volume from etcd's record (not a local file): it serves the
#    in-sync replica's data, resyncs the other, and a verification pass
#    succeeds on each replica alone.
# 4. One etcd member killed under load: no I/O error. Quorum lost: I/O
#    goes on; a replica failure now holds writes and `status` says why;
#    quorum back: they complete.
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/ublk.sh
. /vm/etcd.sh

require_cmd ublk-nvmf gimbal-target fio etcd wget || exit 1
require_module ublk_drv || exit 1

NQN=nqn.2026-01.io.gimbal:cluster
target_conf() { gimbal_file_target_conf t "$1" "$NQN" "CLUSTER000$1" 48MiB; }
start_target() { gimbal_file_target_start t "$1"; }
target_conf 1
target_conf 2
start_target 1 || exit 1
start_target 2 || exit 1
etcd_start || exit 1

# host_conf H: host H's volume file (its own host NQN and state directory).
host_conf() {
    mkdir -p /tmp/h$1-lib /tmp/h$1-run
    cat >/tmp/h$1.toml <<EOC
name = "cv"
[[replica]]
address = "127.0.0.1"
port = 4421
subnqn = "$NQN"
[[replica]]
address = "127.0.0.1"
port = 4422
subnqn = "$NQN"
[host]
nqn = "nqn.2026-01.io.test:host$1"
id = "00000000-0000-4000-8000-00000000000$1"
# The command timeout and the keep-alive are longer than the pause of
# part 2: the paused owner's commands and connections survive it, so its
# writes reach the targets when it resumes and meet the new owner's
# reservation (a shorter bound would time its commands out first, fail a
# replica, and the health change etcd refuses would fence it instead).
[io]
queues = 1
queue_depth = 64
io_timeout = 45
[reconnect]
reconnect_delay = 1
ctrl_loss_tmo = 600
keep_alive_tmo = 45
[replication]
region_size = "1m"
resync_rate = "0"
bitmap_dir = "/tmp/h$1-lib"
[cluster]
endpoints = [$(etcd_endpoints)]
lease_ttl = 6
op_timeout_ms = 500
health_wait = 300
EOC
}
host_conf 1
host_conf 2
# on_host H CMD...: CMD as host H (its run and state directories).
on_host() {
    _h=$1
    shift
    UBLK_NVMF_RUN_DIR=/tmp/h$_h-run UBLK_NVMF_LIB_DIR=/tmp/h$_h-lib "$@"
}
add_on() { on_host "$1" ublk-nvmf add --config /tmp/h$1.toml; }
status_on() { on_host "$1" ublk-nvmf status cv; }
dev_on() { on_host "$1" ublk-nvmf list --json | grep -o '"/dev/ublkb[0-9]*"' | tr -d '"' | head -n1; }
pid_on() { on_host "$1" ublk-nvmf list --json | grep -o '"pid": *[0-9]*' | grep -o '[0-9]*$' | head -n1; }
in_sync_on() { status_on "$1" | grep "replica $2:" | grep -q ' in-sync '; }
both_in_sync_on() { in_sync_on "$1" 0 && in_sync_on "$1" 1; }

# --- 1. attach race -------------------------------------------------------------
add_on 1 >/tmp/add1.out 2>&1 &
p1=$!
add_on 2 >/tmp/add2.out 2>&1 &
p2=$!
wait $p1
r1=$?
wait $p2
r2=$?
log "host 1 add: rc $r1: $(cat /tmp/add1.out)"
log "host 2 add: rc $r2: $(cat /tmp/add2.out)"
check "exactly one host attached" test $((r1 == 0)) -ne $((r2 == 0))
if [ $r1 -eq 0 ]; then A=1 B=2; else A=2 B=1; fi
check_output "the other is told who owns the volume" "owned by nqn.2026-01.io.test:host$A" cat /tmp/add$B.out
DEV_A=$(dev_on $A)
log "host $A owns the volume on $DEV_A"
wait_for "host $A: both replicas in sync" 240 both_in_sync_on $A || status_on $A
check_output "status shows owner, epoch and etcd" "cluster: owner nqn.2026-01.io.test:host$A epoch 1, lease .* etcd reachable" status_on $A

# --- 2. owner paused beyond its lease; takeover; the old owner is fenced -------------
FIO_A="--name=cva --filename=$DEV_A --ioengine=libaio --direct=1 --rw=randwrite --bs=16k \
    --iodepth=8 --size=24M --verify=crc32c --verify_fatal=1 --randrepeat=0"
fio $FIO_A --do_verify=0 --rate=1m --runtime=600 --time_based >"$LOGDIR/fio-a.log" 2>&1 &
fio_a=$!
sleep 4
pid_a=$(pid_on $A)
check "host $A's server paused (SIGSTOP)" kill -STOP "$pid_a"
sleep 8
check_output "host $B attaches once host $A's lease ran out" "^/dev/ublkb" add_on $B
DEV_B=$(dev_on $B)
check_output "host $B owns epoch 2" "cluster: owner nqn.2026-01.io.test:host$B epoch 2" status_on $B
# Sequential, so that a later --verify_only pass rewrites the same layout.
# Small: the old owner stays paused meanwhile, and must be resumed well
# within its command timeout and keep-alive (45 s) for its writes to reach
# the targets.
FIO_B="--name=cvb --filename=$DEV_B --ioengine=libaio --direct=1 --rw=write --bs=16k \
    --iodepth=16 --size=8M --offset=24M --verify=crc32c --verify_fatal=1"
check "host $B: verified writes on the volume it took over" fio $FIO_B --do_verify=1
check "host $A's server resumed (SIGCONT)" kill -CONT "$pid_a"
wait_for "host $A is fenced" 60 sh -c "UBLK_NVMF_RUN_DIR=/tmp/h$A-run ublk-nvmf status cv | grep -q FENCED"
status_on $A
check_output "host $A's writes met Reservation Conflict" "Reservation Conflict" cat /tmp/h$A-run/cv.log
fenced_ok() { ! kill -0 "$fio_a" 2>/dev/null; }
wait_for "host $A's fio ended with errors" 60 fenced_ok
check_fails "host $A's fio saw its writes fail" wait "$fio_a"
check "host $A stops (del)" on_host $A ublk-nvmf del cv
check "host $B: a full verification pass of what it wrote" fio $FIO_B --verify_only
check "host $B: verified writes over the whole volume" fio --name=whole --filename="$DEV_B" \
    --ioengine=libaio --direct=1 --rw=write --bs=64k --iodepth=16 --size=48M \
    --verify=crc32c --verify_fatal=1 --do_verify=1

# --- 3. owner killed while a replica is out of sync ------------------------------------
# Host B owns the volume. Target 2 dies; B writes (replica 1 misses it,
# etcd records replica 1 out of sync); B is killed; target 2 returns with
# stale data; host A starts the volume from etcd's record.
wait_for "host $B: both replicas in sync" 240 both_in_sync_on $B
check "target 2 killed" kill -9 "$(daemon_pid t2)"
# The same job (and layout) is verified later on host A's device.
FIO_3="--name=cv3 --ioengine=libaio --direct=1 --rw=write --bs=64k \
    --iodepth=16 --size=48M --verify=crc32c --verify_fatal=1 --verify_pattern=0x5a5a5a5a"
check "host $B: writes while replica 1 is down" fio $FIO_3 --filename="$DEV_B" --do_verify=0
# The writes completed, so etcd records replica 1 out of sync: nothing is
# pending.
status_on $B
check_output "host $B: replica 1 is out of sync" "replica 1: .* (fencing|failed) " status_on $B
check_fails "host $B: no health change pending" sh -c "UBLK_NVMF_RUN_DIR=/tmp/h$B-run ublk-nvmf status cv | grep -q pending"
check "host $B's server killed (SIGKILL)" kill -9 "$(pid_on $B)"
check "target 2 back (stale)" start_target 2
wait_for_attach() { add_on $A >/tmp/add-a3.out 2>&1; }
wait_for "host $A attaches once host $B's lease ran out" 60 wait_for_attach
DEV_A=$(dev_on $A)
# Host B's device waits for a recovery that will not come (its server
# was killed): remove it, as an operator would on a dead host.
check "host $B's dead device removed" on_host $B ublk-nvmf del cv
status_on $A
check_output "host $A starts from etcd's record: replica 1 is copied" "replica 1: .* (fencing|failed|resyncing) " status_on $A
check_output "host $A logged etcd's plan" "etcd's health record .* source replica 0" cat /tmp/h$A-run/cv.log
check "host $A serves the in-sync replica's data" timeout 300 fio $FIO_3 --filename="$DEV_A" --verify_only
wait_for "host $A: replica 1 resynced" 240 both_in_sync_on $A
check "target 1 killed: only the resynced replica is left" kill -9 "$(daemon_pid t1)"
check "the resynced replica alone holds every write" timeout 300 fio $FIO_3 --filename="$DEV_A" --verify_only
check "target 1 back" start_target 1
wait_for "host $A: both replicas in sync again" 240 both_in_sync_on $A

# --- 4. etcd members down ------------------------------------------------------------
# ~16 s of paced, verified writes, read back at the end.
fio --name=load --filename="$DEV_A" --ioengine=libaio --direct=1 --rw=write --bs=16k \
    --iodepth=8 --size=16M --rate=1m --verify=crc32c --verify_fatal=1 --do_verify=1 \
    >"$LOGDIR/fio-load.log" 2>&1 &
fio_l=$!
sleep 4
check "etcd member 0 killed under load" etcd_kill 0
check "no I/O error with one etcd member down" wait "$fio_l" || tail -n 20 "$LOGDIR/fio-load.log"
check "etcd member 1 killed too: quorum lost" etcd_kill 1
fio_verify "I/O goes on without a quorum (no health change needed)" "$DEV_A" randrw 16k 16 8M
check "target 2 killed without a quorum" kill -9 "$(daemon_pid t2)"
# Its first write finds replica 1 gone: a health change etcd cannot take.
fio --name=held --filename="$DEV_A" --ioengine=libaio --direct=1 --rw=write --bs=64k \
    --iodepth=4 --size=8M --offset=32M --verify=crc32c --verify_fatal=1 --do_verify=1 \
    >"$LOGDIR/fio-held.log" 2>&1 &
fio_h=$!
held() { status_on $A | grep -q "writes held until etcd records"; }
wait_for "writes that skip replica 1 are held" 60 held
check_output "status says why" "pending: record replicas \[1\] out of sync" status_on $A
check "the held writes have not completed" kill -0 "$fio_h"
check "etcd member 0 back" etcd_restart 0
check "etcd member 1 back" etcd_restart 1
check "the held writes complete without an error" wait "$fio_h" || tail -n 20 "$LOGDIR/fio-held.log"
check_output "no errors counted" '"errors":0,' on_host $A ublk-nvmf status cv --json
check "del" on_host $A ublk-nvmf del cv
