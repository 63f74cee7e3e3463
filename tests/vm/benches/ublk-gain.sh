# vm-timeout: 1800
# vm-mem: 4096
# How the credit estimate's gain (`[qos] estimate_gain`) trades throughput
# on a pipeline for protection at a shared device (issue 14's decision of
# the default). Volumes with the default (gain probed between 2 and 64),
# fixed gains 2 and 8 (estimate_gain_max = estimate_gain) and credits off,
# in one guest, BENCH_ROUNDS (2) alternating rounds:
# - on gimbal-target's `null` namespace, alone: 128k sequential read QD 32
#   and 4k random read QD 128 (where the guest's CPU pipeline keeps
#   delivering more with more requests in flight);
# - two tenants on one `sim` device behind a plain target (the setup of
#   the `ublk` bench's part 2): a QD 1 4k reader (default volume) beside a
#   QD 128 4k writer whose volume has the gain under test, or credits off.
# Prints BENCH lines per run and, per gain, the ratios to credits off
# (throughput for the pipeline jobs; reader p99 and total throughput for
# the tenants). BENCH_ONLY=tenants runs the tenants only; BENCH_SCALE
# (50) is the sim device's time scale (100 keeps the device the
# bottleneck on a loaded host). BENCH_GAINS (default probed,2,8; commas,
# as the runner passes values without spaces) lists the gains under
# test: a number is a fixed gain, `probed` the default
# probe (2 to 64), `probedN` the probe with ceiling N (estimate_gain_max
# = N; whether 1 MiB reads, whose window a ceiling of 16 held below
# QD 32, want a higher one: docs/benchmarks.md, "What the gate holds").
# The pipeline jobs include 1M read QD 32. Status at the end shows each
# volume's window with the estimate's bandwidth and base. Run:
# tests/vm/run --bench ublk-gain (~17 min)
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/ublk.sh

SECS=${BENCH_SECS:-8}
ROUNDS=${BENCH_ROUNDS:-2}
TSECS=${BENCH_TENANT_SECS:-15}
TRAMP=${BENCH_TENANT_RAMP:-5}
ONLY=${BENCH_ONLY:-}
SCALE=${BENCH_SCALE:-50}
NQN=nqn.2026-01.io.gimbal:demo
SIM_NQN=nqn.2026-01.io.gimbal:sim
GAINS=$(echo "${BENCH_GAINS:-probed,2,8}" | tr ',' ' ')
# Memory: the guest gets 4 GiB (the vm-mem header): the sim target keeps
# what the writers wrote, up to 512 MiB, and was OOM-killed in the third
# of three rounds with the default 2 GiB (then every tenant run failed).
FIO_BENCH_OUT=/tmp/bench.txt
: >"$FIO_BENCH_OUT"

require_cmd ublk-nvmf gimbal-target fio || exit 1
require_module ublk_drv || exit 1

# volume NAME PORT SUBNQN NSID GAIN|off: adds a volume, prints its device.
volume() {
    _conf=/tmp/vol-$1.toml
    ublk_volume_config "$_conf" "$1" 127.0.0.1 "$2" "$3" "$4" 1
    case "$5" in
    off) printf '[qos]\ncredits = "off"\n' >>"$_conf" ;;
    probed) ;;
    probed*) printf '[qos]\nestimate_gain_max = %s\n' "${5#probed}" >>"$_conf" ;;
    *) printf '[qos]\nestimate_gain = %s\nestimate_gain_max = %s\n' "$5" "$5" >>"$_conf" ;;
    esac
    ublk-nvmf add --config "$_conf" 2>"$LOGDIR/add-$1.log"
}

gimbal_write_config
gimbal_start || exit 1
cat >/tmp/sim-target.toml <<EOC
listen = ["127.0.0.1:4421"]
[[subsystem]]
nqn = "$SIM_NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "sim"
size = "1GiB"
profile = "${BENCH_PROFILE:-fragmented}"
time_scale = $SCALE
qos = "none"
EOC
start_daemon gimbal-sim gimbal-target run --config /tmp/sim-target.toml
wait_for "sim target listens on :4421" 20 gimbal_listening 4421 || exit 1

VOLUMES=""
for g in $GAINS off; do
    d=$(volume "null-$g" 4420 $NQN 3 "$g") && check_output "null volume, gain $g" "^/dev/ublkb" echo "$d" || exit 1
    eval "NULL_$g=$d"
    d=$(volume "writer-$g" 4421 $SIM_NQN 1 "$g") && check_output "sim writer volume, gain $g" "^/dev/ublkb" echo "$d" || exit 1
    eval "WRITER_$g=$d"
    VOLUMES="$VOLUMES null-$g writer-$g"
done
READER=$(volume reader 4421 $SIM_NQN 1 probed) && check_output "sim reader volume" "^/dev/ublkb" echo "$READER" || exit 1
VOLUMES="$VOLUMES reader"

tenant_fio() {
    fio --name=t --filename="$2" --ioengine=libaio --direct=1 --rw="$3" --bs=4k \
        --iodepth="$4" --runtime="$TSECS" --time_based --ramp_time="$TRAMP" --size=512M \
        --randrepeat=0 --norandommap --output-format=terse --terse-version=3 >"$1" 2>&1
}

# tenants ROUND GAIN WRITER_DEV
tenants() {
    tenant_fio /tmp/tw.out "$3" randwrite 128 &
    _p=$!
    tenant_fio /tmp/tr.out "$READER" randread 1
    _rc=$?
    wait $_p
    _wrc=$?
    if [ $_rc -ne 0 ] || [ $_wrc -ne 0 ] || ! grep -q '^3;' /tmp/tr.out || ! grep -q '^3;' /tmp/tw.out; then
        fail "two tenants, round $1, gain $2"
        return 1
    fi
    pass "two tenants, round $1, gain $2"
    {
        grep '^3;' /tmp/tr.out | sed 's/^/R;/'
        grep '^3;' /tmp/tw.out | sed 's/^/W;/'
    } | awk -F';' -v r="$1" -v g="$2" '
        function p99(from, i, a) { for (i = from; i < from + 20; i++) if ($i ~ /^99\.000000%=/) { split($i, a, "="); return a[2] } return 0 }
        $1 == "R" { rk = $8; ri = $9; rp = p99(19) }
        $1 == "W" { wk = $49; wi = $50 }
        END { printf "BENCH round=%s gain=%s job=tenants reader_iops=%d reader_p99_us=%d writer_iops=%d total_kibps=%d\n", r, g, ri, rp, wi, rk + wk }' |
        tee -a "$FIO_BENCH_OUT"
}

round=1
while [ $round -le "$ROUNDS" ]; do
    for job in "128k-read-qd32 read 128k 32" "1m-read-qd32 read 1m 32" "4k-randread-qd128 randread 4k 128"; do
        [ "$ONLY" = tenants ] && break
        set -- $job
        for g in $GAINS off; do
            eval "dev=\$NULL_$g"
            fio_bench "round=$round gain=$g job=$1" "$dev" "$2" "$3" "$4" "$SECS"
        done
    done
    for g in $GAINS off; do
        eval "dev=\$WRITER_$g"
        tenants $round "$g" "$dev"
    done
    round=$((round + 1))
done

# Per gain and round: throughput over credits off (pipeline jobs), reader
# p99 and total over credits off (tenants); then the median over rounds.
grep '^BENCH round=' "$FIO_BENCH_OUT" | awk -v gainlist="$GAINS" "$AWK_STATS"'
    { r = kv("round"); g = kv("gain"); j = kv("job")
      if (j == "tenants") { v[r, g, "reader_p99"] = kv("reader_p99_us"); v[r, g, "total"] = kv("total_kibps") }
      else { v[r, g, j] = (j ~ /^4k/) ? kv("iops") : kv("mibps") }
      rounds[r] = 1 }
    END {
        nk = split("128k-read-qd32 1m-read-qd32 4k-randread-qd128 reader_p99 total", keys, " ")
        ng = split(gainlist, gains, " ")
        for (gi = 1; gi <= ng; gi++) for (ki = 1; ki <= nk; ki++) {
            g = gains[gi]; k = keys[ki]; n = 0
            for (r in rounds) if (v[r, "off", k] > 0) { n++; x[n] = v[r, g, k] / v[r, "off", k] }
            sort(x, n)
            if (n > 0) printf "BENCH summary gain=%s ratio=%s/off median=%.3f min=%.3f max=%.3f rounds=%d\n", g, k, median(x, n), x[1], x[n], n
        }
    }'
for v in $VOLUMES; do
    echo "---- ublk-nvmf status $v ----"
    ublk-nvmf status "$v"
done
for v in $VOLUMES; do check "del $v" ublk-nvmf del "$v"; done
stop_daemon gimbal-sim
stop_daemon gimbal
finish
