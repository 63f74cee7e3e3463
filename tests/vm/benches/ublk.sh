# vm-timeout: 420
# /dev/ublkb0 (ublk-nvmf) versus the kernel NVMe/TCP host's /dev/nvmeXnY,
# both against the same gimbal-target `null` namespace, in one guest: fio
# 4k random read at iodepth 32 and 128k sequential read at iodepth 32.
# Prints BENCH lines and the ratio ublk/kernel; docs/benchmarks.md records
# them. A second volume (/dev/ublkb1, credits = "off") on the same namespace
# shows what the default credit mode costs on this path: gimbal-target's
# plain namespace sends no credits, so the default `auto` runs the
# latency-based estimate. Reports, asserts nothing about speed. Run:
# tests/vm/run --bench ublk
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/ublk.sh

SECS=${BENCH_SECS:-10}
NQN=nqn.2026-01.io.gimbal:demo

require_cmd ublk-nvmf gimbal-target fio || exit 1
require_module ublk_drv nvme-tcp || exit 1
gimbal_write_config
gimbal_start || exit 1
ublk_volume_config /tmp/b.toml bench 127.0.0.1 4420 $NQN 3 1
check_output "ublk-nvmf volume on the null namespace" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/b.toml
ublk_volume_config /tmp/b2.toml benchoff 127.0.0.1 4420 $NQN 3 1
printf '[qos]\ncredits = "off"\n' >>/tmp/b2.toml
check_output "the same with credits off" "^/dev/ublkb1$" ublk-nvmf add --config /tmp/b2.toml
check "kernel host connects" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN
wait_for "kernel host namespaces appear" 20 nvme_ns_dev $NQN 3
kdev=$(nvme_ns_dev $NQN 3)
log "kernel host device for the null namespace: $kdev"

b() { fio_bench "$@" | tee -a /tmp/bench.txt; }
for round in 1 2; do
    b "round=$round host=ublk job=4k-randread-qd32" /dev/ublkb0 randread 4k 32 "$SECS"
    b "round=$round host=ublk-credits-off job=4k-randread-qd32" /dev/ublkb1 randread 4k 32 "$SECS"
    b "round=$round host=kernel job=4k-randread-qd32" "$kdev" randread 4k 32 "$SECS"
    b "round=$round host=ublk job=128k-read-qd32" /dev/ublkb0 read 128k 32 "$SECS"
    b "round=$round host=ublk-credits-off job=128k-read-qd32" /dev/ublkb1 read 128k 32 "$SECS"
    b "round=$round host=kernel job=128k-read-qd32" "$kdev" read 128k 32 "$SECS"
done
ublk-nvmf status bench
ublk-nvmf status benchoff

grep '^BENCH' /tmp/bench.txt | sed -E 's/^BENCH round=([0-9]+) host=([^ ]+) job=([^ ]+) iops=([0-9]+) mibps=([0-9.]+).*/\1 \3 \2 \4 \5/' |
    awk '{ k = $1 " " $2; if ($3 == "kernel") { ki[k] = $4; km[k] = $5 } else if ($3 == "ublk") { oi[k] = $4; om[k] = $5 } }
        END { for (k in oi) if (ki[k] > 0) { split(k, a, " ");
            printf "BENCH round=%s ratio job=%s iops_ublk_over_kernel=%.2f mibps_ublk_over_kernel=%.2f\n", a[1], a[2], oi[k] / ki[k], om[k] / km[k] } }'
check "disconnect the kernel host" nvme disconnect-all
check "del the volume" ublk-nvmf del bench
check "del the credits-off volume" ublk-nvmf del benchoff
