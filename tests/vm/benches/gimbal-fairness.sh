# vm-timeout: 1500
# Fairness of two tenants on one simulated SSD, through the kernel NVMe/TCP
# host: tenant A runs 4 KiB random reads, tenant B 128 KiB random reads
# (then: A reads, B writes, on a fragmented device). Each runs alone, then
# both together, against a namespace with qos = "gimbal" and one with
# qos = "none"; the paper's f-Util (per-tenant bandwidth over its standalone
# bandwidth / 2) is printed as BENCH lines. Run:
#   tests/vm/run --bench gimbal-fairness
#
# Sizing (see docs/benchmarks.md, "Gimbal fairness in the VM"):
# - The simulated DCT983 runs SCALE times slower than real time so that it,
#   not the emulated CPU, is the bottleneck: at 300x it serves ~1,300 4 KiB
#   random reads/s and ~80 128 KiB reads/s, below what the guest moves
#   through the kernel host and our target (~5,000 4 KiB IOPS on `null`).
# - Each tenant keeps enough I/O outstanding to saturate the device alone,
#   as the paper's workers do (4 KiB: 4 jobs x QD 32, the model needs
#   ~128-256 to keep its 32 dies busy; 128 KiB: 4 jobs x QD 4).
# - The switch runs on device time: its rate grows by beta x size per
#   completion, about e^8 per device second, so recovering from 1.3 to 3.2
#   GB/s takes ~0.1 s of device time = 30 s of real time at 300x. RAMP
#   seconds of warm-up per phase let it settle before fio measures.
# - The mixed phase starts from the state the B-alone phase left. After
#   writes alone (fragmented: ~190 MB/s) the rate must grow ~4x, and the
#   write cost settles only once it has (while the rate holds the device
#   below capacity the write buffer absorbs the writer's share, so by
#   §3.4 the cost walks down, and the writer is over-served until the
#   first overload puts it back). That takes ~0.25 s of device time
#   (`cargo run --release -p gimbal-target --example fairness_replay --
#   PHASE_MS WARMUP_MS` replays this bench in the simulation: 0.40-0.63 /
#   1.29-1.46 with the old 83 ms of warm-up, 1.01-1.03 / 1.05-1.06 with
#   250 ms), so mixed phases warm up MIX_RAMP seconds (75 s = 250 ms at
#   300x).
. /vm/lib.sh
. /vm/gimbal.sh

SECS=${BENCH_SECS:-15}
RAMP=${BENCH_RAMP:-25}
MIX_RAMP=${BENCH_MIX_RAMP:-75}
SCALE=${BENCH_SCALE:-300}
HOST_A=$(cat /etc/nvme/hostnqn)
HOST_B=nqn.2014-08.org.nvmexpress:uuid:4b1d9a7e-0d6e-4c1b-9a55-8f0c2a7e1b02
ID_B=4b1d9a7e-0d6e-4c1b-9a55-8f0c2a7e1b02
require_cmd gimbal-target || exit 1
# One block device per controller (not one multipath device per
# namespace), so each tenant has its own.
require_module nvme_core || exit 1
rmmod nvme_core 2>/dev/null
check "nvme_core without multipath" modprobe nvme_core multipath=N
require_module nvme-tcp || exit 1

for qos in gimbal none; do
    cat >>/tmp/fair.toml <<EOC
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:$qos"
allow_any_host = true
[[subsystem.namespace]]
backend = "sim"
size = "1GiB"
profile = "PROFILE"
time_scale = $SCALE
qos = "$qos"
EOC
done
# Tenant B comes in on a second port: nvme-cli 2.3 refuses a second
# connection to the same address and subsystem even with another host NQN.
sed -i '1i listen = ["127.0.0.1:4420", "127.0.0.1:4421"]' /tmp/fair.toml

# dev_for SUBNQN HOSTNQN: the namespace device of that host's controller.
dev_for() {
    for _c in /sys/class/nvme/nvme*; do
        [ "$(cat "$_c/subsysnqn")" = "$1" ] && [ "$(cat "$_c/hostnqn")" = "$2" ] || continue
        for _n in "$_c"/nvme*n1; do [ -b "/dev/${_n##*/}" ] && { echo "/dev/${_n##*/}"; return 0; }; done
    done
    return 1
}

# bw_kib DEV RW BS QD [RAMP]: read or write KiB/s of one timed fio run (4
# jobs of queue depth QD, reported together).
bw_kib() {
    fio --name=w --filename="$1" --ioengine=libaio --direct=1 --rw="$2" --bs="$3" --iodepth="$4" \
        --numjobs=4 --group_reporting --runtime=$SECS --time_based --ramp_time=${5:-$RAMP} --size=512M \
        --randrepeat=0 --norandommap --output-format=terse --terse-version=3 2>/dev/null |
        awk -F';' '/^3;/ { print $7 + $48 }'
}

run_pair() { # LABEL PROFILE RW_A BS_A QD_A RW_B BS_B QD_B
    label=$1 profile=$2
    sed "s/PROFILE/$profile/" /tmp/fair.toml >/tmp/fair-run.toml
    start_daemon gimbal gimbal-target run --config /tmp/fair-run.toml
    wait_for "target up ($label)" 20 gimbal_listening || return 1
    for qos in gimbal none; do
        nqn=nqn.2026-01.io.gimbal:$qos
        check "tenant A connects to $qos" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $nqn
        check "tenant B connects to $qos" nvme connect -t tcp -a 127.0.0.1 -s 4421 -n $nqn --hostnqn=$HOST_B --hostid=$ID_B
    done
    if ! wait_for "tenant devices ($label)" 20 dev_for nqn.2026-01.io.gimbal:none $HOST_B; then
        nvme disconnect-all >/dev/null 2>&1
        stop_daemon gimbal
        return 1
    fi
    for qos in gimbal none; do
        nqn=nqn.2026-01.io.gimbal:$qos
        a=$(dev_for $nqn $HOST_A) b=$(dev_for $nqn $HOST_B)
        alone_a=$(bw_kib "$a" $3 $4 $5)
        alone_b=$(bw_kib "$b" $6 $7 $8)
        bw_kib "$a" $3 $4 $5 $MIX_RAMP >/tmp/mix_a &
        pa=$!
        bw_kib "$b" $6 $7 $8 $MIX_RAMP >/tmp/mix_b
        wait $pa
        mix_a=$(cat /tmp/mix_a) mix_b=$(cat /tmp/mix_b)
        if [ -z "$alone_a" ] || [ -z "$alone_b" ] || [ -z "$mix_a" ] || [ -z "$mix_b" ]; then
            fail "fio runs for $label qos=$qos"
            continue
        fi
        pass "fio runs for $label qos=$qos"
        awk -v sc=$SCALE -v l="$label" -v q=$qos -v aa=$alone_a -v ab=$alone_b -v ma=$mix_a -v mb=$mix_b 'BEGIN {
            fa = (aa > 0) ? ma / (aa / 2) : 0; fb = (ab > 0) ? mb / (ab / 2) : 0;
            printf "BENCH experiment=%s qos=%s scale=" sc " alone_a_kibps=%d alone_b_kibps=%d mixed_a_kibps=%d mixed_b_kibps=%d futil_a=%.2f futil_b=%.2f dev_a=%.2f dev_b=%.2f\n",
                l, q, aa, ab, ma, mb, fa, fb, (fa > 1 ? fa - 1 : 1 - fa), (fb > 1 ? fb - 1 : 1 - fb) }'
    done
    nvme disconnect-all >/dev/null 2>&1
    stop_daemon gimbal
}

log "sim device at ${SCALE}x, ${RAMP}s warm-up (mixed: ${MIX_RAMP}s) + ${SECS}s measured per phase"
run_pair sizes-clean clean randread 4k 32 randread 128k 4
run_pair types-fragmented fragmented randread 4k 32 randwrite 4k 32
