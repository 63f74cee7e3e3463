# vm-timeout: 120
# The guest kernel has what every other scenario relies on: the modules load,
# ublk's control node appears, configfs mounts and nvmet shows up in it, and
# the kernel carries BTF (the ionice side channel needs it).
. /vm/lib.sh

log "kernel $(uname -r)"
for m in ublk_drv configfs nvme-tcp nvmet nvmet-tcp null_blk dm-flakey sch_netem ext4; do
    check "module $m loads" modprobe "$m"
done
check "/dev/ublk-control exists" test -c /dev/ublk-control
check "configfs mounts" mount -t configfs none /sys/kernel/config
check "nvmet appears in configfs" test -d /sys/kernel/config/nvmet/subsystems
check "kernel has BTF" test -s /sys/kernel/btf/vmlinux
check "nvme-fabrics control node exists" test -c /dev/nvme-fabrics
check "fio runs" fio --version
check "nvme-cli runs" nvme version
