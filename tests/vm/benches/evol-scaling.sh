# vm-timeout: 2400
# eVol throughput against the namespaces it spans (issue 18: at least
# 0.8 x K of one namespace for K = 1, 2, 4), in one guest, BENCH_ROUNDS
# (2) alternating rounds.
#
# Two gimbal-targets with four `sim` namespaces each (96 MiB, clean
# profile, time_scale BENCH_SCALE = 1000 so the drives, not the guest's
# CPU, are the bottleneck: one namespace then moves about 3 MB/s of 128k
# reads. At 100 (30 MB/s each) the eVols stayed at about 23 MiB/s for
# every K: the guest's two TCG vCPUs carrying ublk-nvmf, two targets and
# fio were the limit, not the drives; see docs/benchmarks.md).
# Eight namespaces, so no two volumes share one:
# - `plain`: a one-target ublk-nvmf volume on t2n4 (one namespace, the
#   unit the ratios are taken against);
# - `k1`, `k2`, `k4`: eVols of pools of 1, 2 and 4 namespaces (t1n1;
#   t1n2 + t2n1; t1n3 + t1n4 + t2n2 + t2n3), each pool its own etcd
#   prefix and its own arbiter (three members of etcd shared), with the
#   default client settings (auction, eIO, view reports on).
# Each volume's first 64 MiB (32 extents) are written first, so the
# measured I/O touches mapped extents only (first-write allocation is the
# `evol` scenario's subject, not throughput). Jobs: 128k random read and
# 128k random write, QD 32, BENCH_SECS (15) each.
# Prints BENCH lines per run, then per job the ratios kK/plain (goal
# >= 0.8 x K) and kK/k1, median and spread. Status at the end shows each
# eVol's auction and view counters.
# BENCH_AUCTION=off runs the eVols with `[evol] auction = false`.
# Run: tests/vm/run --bench evol-scaling (~12 min).
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/etcd.sh
. /vm/evol.sh

require_cmd ublk-nvmf gimbal-target evol-arbiter fio etcd || exit 1
require_module ublk_drv || exit 1

SECS=${BENCH_SECS:-15}
ROUNDS=${BENCH_ROUNDS:-2}
SCALE=${BENCH_SCALE:-1000}
# BENCH_AUCTION=off: the eVols without the bandwidth auction's gate.
AUCTION=${BENCH_AUCTION:-on}
# BENCH_CREDITS=MODE: the eVols' [qos] credits (default: the default).
CREDITS=${BENCH_CREDITS:-}
FIO_BENCH_OUT=$LOGDIR/evol-scaling.bench
: >"$FIO_BENCH_OUT"

# scaled_target N: target N on 127.0.0.1:442N, four slowed `sim` namespaces.
scaled_target() {
    {
        cat <<EOC
listen = ["127.0.0.1:442$1"]
[[subsystem]]
nqn = "$EVOL_NQN"
serial = "EVOLB00$1"
allow_any_host = true
EOC
        for _ns in 1 2 3 4; do
            cat <<EOC
[[subsystem.namespace]]
nsid = $_ns
backend = "sim"
size = "96MiB"
time_scale = $SCALE
EOC
        done
    } >"/tmp/et$1.toml"
    evol_target_start "$1"
}

# pool K NAMESPACES...: arbiter kK on port 506K for prefix /bench-kK (50 ms
# auction epochs: TCG's gRPC round trips are milliseconds), its pool of
# NAMESPACES (tTnN), and eVol kK of 64 MiB on it, added as a device.
pool() {
    _k=$1
    shift
    EVOL_PREFIX=/bench-k$_k
    cat >"/tmp/arb-k$_k.toml" <<EOC
id = "k$_k"
listen = "127.0.0.1:506$_k"
[etcd]
endpoints = [$(etcd_endpoints)]
prefix = "$EVOL_PREFIX"
lease_ttl = 4
[auction]
epoch_ns = 50000000
EOC
    start_daemon "arb-k$_k" evol-arbiter run --config "/tmp/arb-k$_k.toml"
    wait_for "arbiter k$_k leads" 60 leader_is "k$_k" || return 1
    for _ns in "$@"; do
        _t=${_ns#t}
        _t=${_t%%n*}
        check "k$_k: pool add $_ns" arb pool add --id "$_ns" --target "t$_t" \
            --address "127.0.0.1:442$_t" --subnqn "$EVOL_NQN" --nsid "${_ns##*n}" || return 1
    done
    check "k$_k: volume create" arb volume create "k$_k" --size 64MiB --copies 1 || return 1
    evol_volume_conf "k$_k"
    if [ "$AUCTION" = off ]; then
        sed -i 's/^alloc_wait = 60$/alloc_wait = 60\nauction = false/' "/tmp/k$_k.toml"
    fi
    if [ -n "$CREDITS" ]; then
        printf '[qos]\ncredits = "%s"\n' "$CREDITS" >>"/tmp/k$_k.toml"
    fi
    check_output "k$_k: add the eVol" "^/dev/ublkb" ublk-nvmf add --config "/tmp/k$_k.toml" || return 1
}

etcd_start || exit 1
scaled_target 1 || exit 1
scaled_target 2 || exit 1

cat >/tmp/plain.toml <<EOC
name = "plain"
[target]
address = "127.0.0.1"
port = 4422
subnqn = "$EVOL_NQN"
nsid = 4
[io]
queues = 1
queue_depth = 64
io_timeout = 30
EOC
check_output "add the plain volume on t2n4" "^/dev/ublkb" ublk-nvmf add --config /tmp/plain.toml || exit 1
PLAIN=$(ublk-nvmf status plain | sed -n 's|^volume plain: \(/dev/ublkb[0-9]*\) .*|\1|p')

pool 1 t1n1 || exit 1
pool 2 t1n2 t2n1 || exit 1
pool 4 t1n3 t1n4 t2n2 t2n3 || exit 1

for v in plain k1 k2 k4; do
    if [ "$v" = plain ]; then dev=$PLAIN; else dev=$(evol_dev "$v"); fi
    check "$v: write the first 64 MiB (maps its extents)" fio --name=fill --filename="$dev" \
        --ioengine=libaio --direct=1 --rw=write --bs=1M --iodepth=8 --size=64M
done
for k in 1 2 4; do
    EVOL_PREFIX=/bench-k$k
    check_output "k$k: every extent of the 64 MiB is mapped, on $k namespaces" \
        "evol k$k: $k members, 32 extents mapped" ublk-nvmf status "k$k"
done

r=1
while [ $r -le "$ROUNDS" ]; do
    for job in 128k-randread 128k-randwrite; do
        rw=${job#128k-}
        for v in plain k1 k2 k4; do
            if [ "$v" = plain ]; then dev=$PLAIN; else dev=$(evol_dev "$v"); fi
            fio_bench "round=$r vol=$v job=$job" "$dev" "$rw" 128k 32 "$SECS"
        done
    done
    r=$((r + 1))
done

bench_ratios "$FIO_BENCH_OUT" vol "k1/plain k2/plain k4/plain k2/k1 k4/k1" \
    "k1/plain:128k-randread:>=0.8 k2/plain:128k-randread:>=1.6 k4/plain:128k-randread:>=3.2 k1/plain:128k-randwrite:>=0.8 k2/plain:128k-randwrite:>=1.6 k4/plain:128k-randwrite:>=3.2"

for k in 1 2 4; do
    ublk-nvmf status "k$k" | grep -E "^volume|evol|qos: credits"
done
for v in k1 k2 k4 plain; do check "del $v" ublk-nvmf del "$v"; done
finish
