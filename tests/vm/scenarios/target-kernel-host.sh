# vm-timeout: 600
# The Linux kernel's NVMe/TCP host (nvme-cli) against our gimbal-target:
# discovery, identify, verified fio over in-capsule and R2T paths, ext4
# across disconnects and target restarts, discard and flush.
. /vm/lib.sh
. /vm/nvmet.sh
. /vm/gimbal.sh

NQN=nqn.2026-01.io.gimbal:demo
require_cmd gimbal-target || exit 1
require_module nvme-tcp ext4 || exit 1

gimbal_write_config
gimbal_start || exit 1

check_output "nvme discover lists our subsystem" "subnqn: +$NQN" nvme discover -t tcp -a 127.0.0.1 -s 4420
check_output "discovery entry names the address" "traddr: +127.0.0.1" nvme discover -t tcp -a 127.0.0.1 -s 4420
check "nvme connect" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN --reconnect-delay=1 --ctrl-loss-tmo=60
# Linux (6.5+) scans namespaces asynchronously, in no fixed order: wait
# for every one, not the last nsid (nsid 3 once appeared before 1 and 2).
all_ns() { nvme_ns_dev $NQN 1 && nvme_ns_dev $NQN 2 && nvme_ns_dev $NQN 3; }
wait_for "namespace devices appear" 20 all_ns || exit 1
ram=$(nvme_ns_dev $NQN 1)
file=$(nvme_ns_dev $NQN 2)
null=$(nvme_ns_dev $NQN 3)
log "ram=$ram file=$file null=$null"
[ -n "$ram" ] && [ -n "$file" ] && [ -n "$null" ] || exit 1
ctrl=$(nvme_ctrl_for $NQN)
log "controller $ctrl"

check_output "id-ctrl reports the model" "mn +: gimbal-target vm" nvme id-ctrl "$ctrl"
check_output "id-ctrl reports the serial" "sn +: GIMBALVM0001" nvme id-ctrl "$ctrl"
check_output "id-ctrl reports the subsystem NQN" "subnqn +: $NQN" nvme id-ctrl "$ctrl"
check_output "id-ns reports 256 MiB of 512-byte blocks" "nsze +: 0x80000" nvme id-ns "$ram"
check_output "nvme list shows the namespaces" "gimbal-target vm" nvme list
check_eq "block size from the LBA format" 512 "$(cat /sys/block/${ram#/dev/}/queue/logical_block_size)"

# In-capsule (4k), R2T (64k) and MDTS-sized (1M) writes, shallow and deep.
for bs in 4k 64k 1M; do
    for qd in 1 32; do
        fio_verify "fio randwrite bs=$bs qd=$qd (ram)" "$ram" randwrite $bs $qd 8M
        fio_verify "fio randrw bs=$bs qd=$qd (file)" "$file" randrw $bs $qd 8M
    done
done

check "nvme flush" nvme flush "$file" -n 2
check "blkdiscard the ram namespace" blkdiscard_real "$ram"
zeros_left() { [ "$(dd if="$1" bs=1M count=8 iflag=direct 2>/dev/null | tr -d '\000' | wc -c)" = 0 ]; }
check "discarded blocks read back as zeros" zeros_left "$ram"

# ext4 on the file namespace: across umount, disconnect/reconnect and a
# target restart.
check "mkfs.ext4" mkfs_ext4 "$file"
mkdir -p /mnt/g
check "mount" mount -t ext4 "$file" /mnt/g
check "write files" sh -c 'for i in 1 2 3; do dd if=/dev/urandom of=/mnt/g/f$i bs=64k count=16 2>/dev/null || exit 1; done; sync; md5sum /mnt/g/f* > /tmp/sums'
check "umount" umount /mnt/g
check "disconnect" nvme disconnect -n $NQN
check "reconnect" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN --reconnect-delay=1 --ctrl-loss-tmo=60
wait_for "file namespace back" 20 nvme_ns_dev $NQN 2
file=$(nvme_ns_dev $NQN 2)
check "remount" mount -t ext4 "$file" /mnt/g
check "files intact after reconnect" sh -c 'grep -q " /mnt/g " /proc/mounts && md5sum -c /tmp/sums'
check "umount again" umount /mnt/g

# Restart the target under a connected host: the host reconnects by itself.
check "stop target (SIGTERM)" stop_daemon gimbal TERM
check_fails "target stopped" gimbal_listening
gimbal_start || exit 1
ctrl_live() { [ "$(cat /sys/class/nvme/${ctrl#/dev/}/state 2>/dev/null)" = live ]; }
wait_for "host reconnected to the restarted target" 60 ctrl_live
wait_for "file namespace usable" 20 nvme_ns_dev $NQN 2
file=$(nvme_ns_dev $NQN 2)
check "mount after target restart" mount -t ext4 "$file" /mnt/g
check "files intact after target restart" sh -c 'grep -q " /mnt/g " /proc/mounts && md5sum -c /tmp/sums'
check "umount" umount /mnt/g
check "e2fsck clean" e2fsck -f -n "$file"
check "disconnect all" nvme disconnect-all
check "target still up" daemon_alive gimbal
