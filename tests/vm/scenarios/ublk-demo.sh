# vm-timeout: 300
# `ublk-nvmf demo` brings up /dev/ublkb0 over a gimbal-target child process
# (RAM namespace; the binary is found next to ublk-nvmf in /usr/bin): ext4
# on it (mkfs, mount, write, read back, umount, e2fsck -f clean), a verified
# fio run, discard, and Ctrl-C removes it and stops the target.
. /vm/lib.sh

require_cmd ublk-nvmf gimbal-target fio || exit 1
require_module ublk_drv ext4 || exit 1

start_daemon demo ublk-nvmf demo --size 512MiB
wait_for "demo prints /dev/ublkb0" 60 grep -q /dev/ublkb0 "$LOGDIR/daemon-demo.log"
check "/dev/ublkb0 is a block device" test -b /dev/ublkb0
check_output "logical block size comes from the namespace (4096)" "^4096$" cat /sys/block/ublkb0/queue/logical_block_size
check_output "capacity comes from NSZE (512 MiB)" "^1048576$" cat /sys/block/ublkb0/size
check_output "RAM namespace: no volatile cache (VWC=0), write through" "write through" cat /sys/block/ublkb0/queue/write_cache
check_output "discard offered" "^[1-9]" cat /sys/block/ublkb0/queue/discard_max_bytes

check "mkfs.ext4" mkfs_ext4 /dev/ublkb0
mkdir -p /mnt/u
check "mount" mount -t ext4 /dev/ublkb0 /mnt/u
write_files() {
    i=0
    while [ $i -lt 20 ]; do
        dd if=/dev/urandom of=/mnt/u/f$i bs=64k count=8 2>/dev/null || return 1
        i=$((i + 1))
    done
    md5sum /mnt/u/f* >/tmp/sums && sync
}
check "write 20 files and sync" write_files
check "umount" umount /mnt/u
check "mount again" mount -t ext4 /dev/ublkb0 /mnt/u
check "files read back identical" md5sum -c /tmp/sums
check "umount again" umount /mnt/u
check "e2fsck -f is clean" /usr/sbin/e2fsck -f -n /dev/ublkb0
fio_verify "fio verify randrw 4k..1M qd32" /dev/ublkb0 randrw 4k 32 64M --bsrange=4k-1M
check "blkdiscard" blkdiscard_real -o 0 -l 67108864 /dev/ublkb0
check_output "status reports I/O" "writes [1-9]" ublk-nvmf status demo
check_output "list shows the volume" "^/dev/ublkb0 +demo " ublk-nvmf list
check "Ctrl-C stops the demo" stop_daemon demo INT
gone() { ! test -e /dev/ublkb0; }
wait_for "/dev/ublkb0 is removed" 20 gone
target_gone() { ! grep -qsx gimbal-target /proc/[0-9]*/comm; }
wait_for "the gimbal-target child is stopped" 20 target_gone
