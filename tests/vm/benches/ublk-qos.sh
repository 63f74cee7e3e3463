# vm-timeout: 420
# Cost of ublk-nvmf's client-side QoS when it admits everything: two
# volumes on the same gimbal-target `null` namespace in one guest, one with
# QoS off (credits = "off", no limits), one with the credit gate and the
# rate limiter on but never binding (credits = "target" with an initial
# window of 65535, since a plain namespace reports no credits; riops/rbps
# far above anything reachable). fio 4k random read at iodepth 32,
# alternating, three rounds; BENCH lines and the on/off ratio per round.
# Reports, asserts nothing about speed. Run: tests/vm/run --bench ublk-qos
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/ublk.sh

SECS=${BENCH_SECS:-10}
NQN=nqn.2026-01.io.gimbal:demo

require_cmd ublk-nvmf gimbal-target fio || exit 1
require_module ublk_drv || exit 1
gimbal_write_config
gimbal_start || exit 1
ublk_volume_config /tmp/off.toml qosoff 127.0.0.1 4420 $NQN 3 1
printf '[qos]\ncredits = "off"\n' >>/tmp/off.toml
ublk_volume_config /tmp/on.toml qoson 127.0.0.1 4420 $NQN 3 1
printf '[qos]\ncredits = "target"\ninitial_window = 65535\nriops = 1000000000\nwiops = 1000000000\nrbps = 1000000000000\nwbps = 1000000000000\n' >>/tmp/on.toml
check_output "volume with QoS off" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/off.toml
check_output "volume with QoS on, admitting everything" "^/dev/ublkb1$" ublk-nvmf add --config /tmp/on.toml

FIO_BENCH_OUT=/tmp/bench.txt
b() { fio_bench "$@"; }
iops() { grep "BENCH $1 " /tmp/bench.txt | sed 's/.* iops=\([0-9]*\).*/\1/'; }
for round in 1 2 3; do
    b "round=$round qos=off job=4k-randread-qd32" /dev/ublkb0 randread 4k 32 "$SECS"
    b "round=$round qos=on job=4k-randread-qd32" /dev/ublkb1 randread 4k 32 "$SECS"
    off=$(iops "round=$round qos=off job=4k-randread-qd32")
    on=$(iops "round=$round qos=on job=4k-randread-qd32")
    echo "BENCH round=$round ratio on/off=$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.3f", a / b }')"
done
st=$(ublk-nvmf status qoson --json)
log "qos=on status: $st"
check_output "qos=on: the gate and limiter were in the path (requests admitted)" '"admitted":[1-9]' echo "$st"
check_output "qos=on: nothing waited for the limiter" '"limiter_delays":0,' echo "$st"
check_output "qos=on: no errors" '"errors":0' echo "$st"
check "del qosoff" ublk-nvmf del qosoff
check "del qoson" ublk-nvmf del qoson
stop_daemon gimbal
finish
