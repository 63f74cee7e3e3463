# vm-timeout: 900
# ionice classes end to end (issue 8): two fio jobs on one /dev/ublkb0, one
# under `ionice -c1` (realtime -> NVMe high), one under `ionice -c3` (idle
# -> low), both backlogged on a simulated SSD behind gimbal-target. The
# target arbitrates between the classes (device_queue_depth bounds what
# the device holds, the rest waits in the class arbiter) with the weights
# the volume sent (high:medium:low = 4:2:1). Runs:
#   drr-4k-4k    DRR by bytes, both 4 KiB      -> bandwidth ~4:1
#   drr-4k-64k   DRR, realtime 4 KiB, idle 64 KiB -> bytes still ~4:1
#   wrr-4k-64k   WRR by commands, same sizes   -> commands 4:1, so bytes
#                ~4x4k : 64k = 1:4 (the paper's Scenario 1: WRR loses the
#                byte ratio when sizes differ)
#   control      side channel off (source = "fixed"): both medium -> ~1:1
#   control-mq-deadline  the same with the kernel's mq-deadline scheduler on
#                /dev/ublkb0, which itself dispatches by ionice class
# Every other run sets the device's scheduler to `none`, so what is
# measured is ublk-nvmf's classes and the target's arbitration, not the
# kernel's scheduler.
# Each prints BENCH lines with per-job bandwidth, IOPS and p99, the ratio,
# and the share `gimbal-target plan` (the ionice paper's Equations 1-3)
# predicts for the measured total; and the volume's per-class counters.
# Reports; asserts only that the runs completed. Run:
#   tests/vm/run --bench ublk-ionice
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/ublk.sh

SECS=${BENCH_SECS:-20}
RAMP=${BENCH_RAMP:-5}
SCALE=${BENCH_SCALE:-300}
NQN=nqn.2026-01.io.gimbal:ionice
require_cmd ublk-nvmf gimbal-target fio ionice || exit 1
require_module ublk_drv || exit 1

cat >/tmp/gi.toml <<EOC
listen = ["127.0.0.1:4420"]
[[subsystem]]
nqn = "$NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "sim"
size = "1GiB"
profile = "clean"
time_scale = $SCALE
qos = "none"
device_queue_depth = 8
class_aging_us = 0
EOC
start_daemon gimbal gimbal-target run --config /tmp/gi.toml
wait_for "gimbal-target listens" 20 gimbal_listening || exit 1

# job OUT BS QD IONICE...: a timed randread job, terse v3 to OUT.
job() {
    _out=$1 _bs=$2 _qd=$3
    shift 3
    "$@" fio --name=j --filename=/dev/ublkb0 --ioengine=libaio --direct=1 --rw=randread \
        --bs="$_bs" --iodepth="$_qd" --runtime="$SECS" --time_based --ramp_time="$RAMP" \
        --size=512M --randrepeat=0 --norandommap --output-format=terse --terse-version=3 \
        >"$_out" 2>&1
}
# field OUT N: terse field N of OUT.
field() { awk -F';' -v n="$2" '/^3;/ { print $n }' "$1"; }
p99() { awk -F';' '/^3;/ { for (i = 18; i <= 37; i++) if ($i ~ /^99\.000000%=/) { split($i, a, "="); print a[2] } }' "$1"; }

# run LABEL PRIORITY_TOML BS_RT QD_RT BS_IDLE QD_IDLE MODE [SCHEDULER]
run() {
    label=$1
    ublk_volume_config /tmp/iv.toml iv 127.0.0.1 4420 $NQN 1 1
    printf '[qos]\ncredits = "off"\n[priority]\nhigh_weight = 4\nmedium_weight = 2\nlow_weight = 1\naging_ms = 0\n%b' "$2" >>/tmp/iv.toml
    check_output "$label: add" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/iv.toml || return 1
    ublk-nvmf status iv | grep 'priority:'
    echo "${8:-none}" >/sys/block/ublkb0/queue/scheduler
    log "$label: scheduler $(cat /sys/block/ublkb0/queue/scheduler)"
    job /tmp/rt.out "$3" "$4" ionice -c1 -n0 &
    p=$!
    job /tmp/idle.out "$5" "$6" ionice -c3
    wait $p
    if ! grep -q '^3;' /tmp/rt.out || ! grep -q '^3;' /tmp/idle.out; then
        fail "$label: fio runs"
        tail -n 5 /tmp/rt.out /tmp/idle.out
    else
        pass "$label: fio runs"
        rt_kib=$(field /tmp/rt.out 7) idle_kib=$(field /tmp/idle.out 7)
        rt_iops=$(field /tmp/rt.out 8) idle_iops=$(field /tmp/idle.out 8)
        total=$(awk -v a="$rt_kib" -v b="$idle_kib" -v c="$rt_iops" -v d="$idle_iops" -v m="$7" \
            'BEGIN { if (m == "drr") printf "%d", (a + b) * 1024; else printf "%d", c + d }')
        case "$2" in
        *fixed*) echo "    plan: both jobs in one class (medium): no class arbitration, equal shares expected" ;;
        *)
            plan=$(gimbal-target plan --weights 4,2,1 --load high=max,low=max --device "$total" --mode "$7" 2>&1)
            echo "$plan" | sed 's/^/    plan: /'
            ;;
        esac
        awk -v l="$label" -v a="$rt_kib" -v b="$idle_kib" -v c="$rt_iops" -v d="$idle_iops" \
            -v pa="$(p99 /tmp/rt.out)" -v pb="$(p99 /tmp/idle.out)" 'BEGIN {
            printf "BENCH run=%s rt_kibps=%d idle_kibps=%d rt_iops=%d idle_iops=%d rt_p99_us=%s idle_p99_us=%s bw_ratio=%.2f iops_ratio=%.2f\n",
                l, a, b, c, d, pa, pb, (b > 0 ? a / b : 0), (d > 0 ? c / d : 0) }'
    fi
    ublk-nvmf status iv | grep -E 'priority:|class '
    check "$label: del" ublk-nvmf del iv
    wait_for "$label: /dev/ublkb0 removed" 20 sh -c '! test -e /dev/ublkb0'
}

log "sim device at ${SCALE}x, ${RAMP}s warm-up + ${SECS}s measured per run"
run drr-4k-4k 'arbitration = "drr"\n' 4k 32 4k 32 drr
run drr-4k-64k 'arbitration = "drr"\n' 4k 32 64k 8 drr
run wrr-4k-64k 'arbitration = "wrr"\n' 4k 32 64k 8 wrr
run control 'arbitration = "drr"\nsource = "fixed"\n' 4k 32 4k 32 drr
run control-mq-deadline 'arbitration = "drr"\nsource = "fixed"\n' 4k 32 4k 32 drr mq-deadline
stop_daemon gimbal
finish
