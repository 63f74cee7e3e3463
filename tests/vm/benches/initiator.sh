# vm-timeout: 420
# Our embedded initiator (ublk-nvmf bench) versus the kernel's NVMe/TCP host
# (fio on /dev/nvmeXnY), both against the same kernel nvmet-tcp target with
# a null_blk namespace, in one guest: 4k random read at iodepth 32 and 128k
# sequential read at iodepth 32. Prints BENCH lines and the ratio
# ours/kernel; docs/benchmarks.md records them. Reports, asserts nothing
# about speed. Run: tests/vm/run --bench initiator
. /vm/lib.sh
. /vm/nvmet.sh

SECS=${BENCH_SECS:-10}
NQN=nqn.2026-01.io.test:nvmet-null
T="-a 127.0.0.1 -s 4420 -n $NQN"

require_cmd ublk-nvmf fio || exit 1
require_module nvme-tcp || exit 1
nvmet_init || exit 1
require_module null_blk || exit 1
setup() { nvmet_port 1 127.0.0.1 4420 && nvmet_subsys $NQN && nvmet_ns $NQN 1 /dev/nullb0 && nvmet_link 1 $NQN; }
check "nvmet with null_blk on :4420" setup
check "kernel host connects" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN
wait_for "kernel host device appears" 20 nvme_dev_for $NQN
kdev=$(nvme_dev_for $NQN)
log "kernel host device: $kdev"

# ours LABEL RW BS QD: one ublk-nvmf bench run, printed as a BENCH line
# like fio_bench's (MiB/s, p99 in microseconds).
ours() {
    _j=$(ublk-nvmf bench $T --rw "$2" --bs "$3" --iodepth "$4" --runtime "$SECS" --size 64m --json) ||
        { fail "ublk-nvmf bench $1"; echo "$_j"; return 1; }
    echo "$_j" | sed -E 's/.*"read":\{"ios":[0-9]+,"bytes":[0-9]+,"iops":([0-9.]+),"mbps":([0-9.]+),"lat_us":\{"p50":[0-9.]+,"p99":([0-9.]+).*/\1 \2 \3/' |
        awk -v label="$1" '{ printf "BENCH %s iops=%d mibps=%.1f p99_us=%.1f\n", label, $1, $2 * 1e6 / 1048576, $3 }' |
        tee -a /tmp/bench.txt
    pass "ublk-nvmf bench $1"
}
FIO_BENCH_OUT=/tmp/bench.txt
kernel() { fio_bench "$@"; }

for round in 1 2; do
    ours "round=$round host=ublk-nvmf job=4k-randread-qd32" randread 4k 32
    kernel "round=$round host=kernel job=4k-randread-qd32" "$kdev" randread 4k 32 "$SECS"
    ours "round=$round host=ublk-nvmf job=128k-read-qd32" read 128k 32
    kernel "round=$round host=kernel job=128k-read-qd32" "$kdev" read 128k 32 "$SECS"
done

# Ratios (ours / kernel) per round and job.
grep '^BENCH' /tmp/bench.txt | sed -E 's/^BENCH round=([0-9]+) host=([^ ]+) job=([^ ]+) iops=([0-9]+) mibps=([0-9.]+).*/\1 \3 \2 \4 \5/' |
    awk '{ k = $1 " " $2; if ($3 == "kernel") { ki[k] = $4; km[k] = $5 } else { oi[k] = $4; om[k] = $5 } }
        END { for (k in oi) if (ki[k] > 0) { split(k, a, " ");
            printf "BENCH round=%s ratio job=%s iops_ours_over_kernel=%.2f mibps_ours_over_kernel=%.2f\n", a[1], a[2], oi[k] / ki[k], om[k] / km[k] } }'
check "disconnect the kernel host" nvme disconnect-all
