# vm-timeout: 420
# The reference pair nobody here wrote: the kernel NVMe/TCP host (nvme-cli)
# against the kernel nvmet-tcp target on loopback, with a memory-backed
# null_blk namespace and a file-backed one. Proves the bench can run the
# peers later scenarios compare our initiator and target against.
. /vm/lib.sh
. /vm/nvmet.sh

NULL_NQN=nqn.2026-01.io.test:nvmet-null
FILE_NQN=nqn.2026-01.io.test:nvmet-file

nvmet_init || exit 1
require_module nvme-tcp ext4 || exit 1
# memory_backed: a plain null_blk drops writes, and verification needs data.
require_module null_blk || exit 1
rmmod null_blk
check "null_blk memory-backed device" modprobe null_blk nr_devices=1 memory_backed=1 gb=1
check "backing file on tmpfs" truncate -s 256M /tmp/nvmet-file.img

null_subsystem() { nvmet_subsys $NULL_NQN && nvmet_ns $NULL_NQN 1 /dev/nullb0; }
file_subsystem() { nvmet_subsys $FILE_NQN && nvmet_ns $FILE_NQN 1 /tmp/nvmet-file.img; }
link_both() { nvmet_link 1 $NULL_NQN && nvmet_link 1 $FILE_NQN; }
check "nvmet port 127.0.0.1:4420" nvmet_port 1 127.0.0.1 4420
check "subsystem with null_blk namespace" null_subsystem
check "subsystem with file namespace" file_subsystem
check "link subsystems to port" link_both

check_output "nvme discover lists the null_blk subsystem" "subnqn: +$NULL_NQN" \
    nvme discover -t tcp -a 127.0.0.1 -s 4420
check_output "nvme discover lists the file subsystem" "subnqn: +$FILE_NQN" \
    nvme discover -t tcp -a 127.0.0.1 -s 4420

check "nvme connect (null_blk)" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NULL_NQN
check "nvme connect (file)" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $FILE_NQN
wait_for "null_blk namespace device appears" 20 nvme_dev_for $NULL_NQN
wait_for "file namespace device appears" 20 nvme_dev_for $FILE_NQN
null_dev=$(nvme_dev_for $NULL_NQN)
file_dev=$(nvme_dev_for $FILE_NQN)
log "null_blk namespace: $null_dev, file namespace: $file_dev"
[ -n "$null_dev" ] && [ -n "$file_dev" ] || exit 1
check_output "nvme list shows both" "$file_dev" nvme list

for dev in "$null_dev" "$file_dev"; do
    fio_verify "fio verify randwrite 4k qd32 on $dev" "$dev" randwrite 4k 32 16M
    fio_verify "fio verify randwrite 128k qd32 on $dev" "$dev" randwrite 128k 32 16M
done

# A file system on the file-backed namespace survives umount/mount and a
# disconnect/reconnect of the host.
check "mkfs.ext4" mkfs_ext4 "$file_dev"
mkdir -p /mnt/nvme
check "mount ext4" mount -t ext4 "$file_dev" /mnt/nvme
check "write files" sh -c 'grep -q " /mnt/nvme " /proc/mounts || exit 1; for i in 1 2 3 4; do dd if=/dev/urandom of=/mnt/nvme/f$i bs=64k count=16 2>/dev/null || exit 1; done; md5sum /mnt/nvme/f* > /tmp/sums'
check "umount" umount /mnt/nvme
check "disconnect file subsystem" nvme disconnect -n $FILE_NQN
check "reconnect file subsystem" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $FILE_NQN
wait_for "file namespace device reappears" 20 nvme_dev_for $FILE_NQN
file_dev=$(nvme_dev_for $FILE_NQN)
check "remount ext4" mount -t ext4 "$file_dev" /mnt/nvme
check "files read back intact" sh -c 'grep -q " /mnt/nvme " /proc/mounts && md5sum -c /tmp/sums'
check "umount again" umount /mnt/nvme
check "e2fsck clean" e2fsck -f -n "$file_dev"
check "disconnect all" nvme disconnect-all
check "nvmet teardown" nvmet_clear
