# vm-timeout: 400
# Crash recovery: `kill -9` of the ublk-nvmf server in the middle of a
# verified fio run on a mounted ext4, then `ublk-nvmf recover`: the same
# /dev/ublkb0 comes back, fio finishes with no I/O or verify error, ext4
# stays mounted and is fsck-clean afterwards.
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/ublk.sh

require_cmd ublk-nvmf gimbal-target fio || exit 1
require_module ublk_drv ext4 || exit 1

gimbal_write_config
gimbal_start || exit 1
ublk_volume_config /tmp/r.toml rec 127.0.0.1 4420 nqn.2026-01.io.gimbal:demo 2 2
check_output "add" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/r.toml
check "mkfs.ext4" mkfs_ext4 /dev/ublkb0
mkdir -p /mnt/r
check "mount" mount -t ext4 /dev/ublkb0 /mnt/r

server_pid() { ublk-nvmf list | awk '$2=="rec" && $3!="dead" {print $3}'; }
pid=$(server_pid)
log "server pid $pid"

fio --name=crash --directory=/mnt/r --ioengine=libaio --direct=1 --rw=randrw --bs=4k \
    --bsrange=4k-256k --iodepth=32 --size=48M --verify=crc32c --verify_fatal=1 \
    --do_verify=1 --randrepeat=0 --fsync=64 >"$LOGDIR/fio-crash.log" 2>&1 &
fio_pid=$!
fio_busy() { grep -q "crash.0.0" /proc/mounts 2>/dev/null || [ -s /mnt/r/crash.0.0 ]; }
wait_for "fio is writing" 30 fio_busy
sleep 3
check "kill -9 the server mid-run" kill -9 "$pid"
dead() { ! kill -0 "$pid" 2>/dev/null; }
wait_for "server is gone" 10 dead
check_output "the device waits for recovery (list shows it dead)" "^/dev/ublkb0 +rec +dead " ublk-nvmf list
check_output "recover reattaches /dev/ublkb0" "^/dev/ublkb0$" ublk-nvmf recover rec
log "recovered server log:"; tail -n 30 /run/ublk-nvmf/rec.log
check "fio completes with no I/O or verify error" wait $fio_pid
tail -n 15 "$LOGDIR/fio-crash.log"
check "ext4 is still mounted" is_mounted /mnt/r
check "write after recovery" sh -c 'echo hello >/mnt/r/after && sync'
check "umount" umount /mnt/r
check "e2fsck -f is clean" /usr/sbin/e2fsck -f -n /dev/ublkb0
check_output "a second crash and recover works too" "^/dev/ublkb0$" sh -c "kill -9 $(server_pid); sleep 1; ublk-nvmf recover rec"
check "verified fio on the raw device after it" fio --name=raw --filename=/dev/ublkb0 --ioengine=libaio --direct=1 --rw=randrw --bs=64k --iodepth=16 --size=16M --verify=crc32c --verify_fatal=1
check "del" ublk-nvmf del rec
