# vm-timeout: 400
# Our target versus the kernel's nvmet-tcp, both through the kernel NVMe/TCP
# host in the same guest: gimbal-target with a `null` namespace against
# nvmet with a null_blk namespace. Prints BENCH lines; docs/benchmarks.md
# records them. Run: tests/vm/run --bench target
. /vm/lib.sh
. /vm/nvmet.sh
. /vm/gimbal.sh

SECS=${BENCH_SECS:-15}
OURS=nqn.2026-01.io.gimbal:demo
KERNEL=nqn.2026-01.io.test:nvmet-null
require_cmd gimbal-target || exit 1
require_module nvme-tcp || exit 1
nvmet_init || exit 1
require_module null_blk || exit 1

gimbal_write_config
gimbal_start || exit 1
null_kernel() { nvmet_port 1 127.0.0.1 4421 && nvmet_subsys $KERNEL && nvmet_ns $KERNEL 1 /dev/nullb0 && nvmet_link 1 $KERNEL; }
check "kernel nvmet with null_blk on :4421" null_kernel
check "connect to gimbal-target" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $OURS
check "connect to nvmet" nvme connect -t tcp -a 127.0.0.1 -s 4421 -n $KERNEL
wait_for "devices appear" 20 nvme_ns_dev $OURS 3
wait_for "kernel target device appears" 20 nvme_dev_for $KERNEL
ours=$(nvme_ns_dev $OURS 3)
kern=$(nvme_dev_for $KERNEL)
log "gimbal-target null: $ours, nvmet null_blk: $kern"

for round in 1 2; do
    fio_bench "round=$round target=gimbal job=4k-randread-qd32" "$ours" randread 4k 32 $SECS
    fio_bench "round=$round target=nvmet job=4k-randread-qd32" "$kern" randread 4k 32 $SECS
    fio_bench "round=$round target=gimbal job=128k-read-qd32" "$ours" read 128k 32 $SECS
    fio_bench "round=$round target=nvmet job=128k-read-qd32" "$kern" read 128k 32 $SECS
done
check "disconnect" nvme disconnect-all
