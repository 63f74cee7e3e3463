# vm-timeout: 600
# Prometheus metrics of both daemons under load: gimbal-target (a Gimbal
# RAM namespace, [metrics] listen) and a ublk-nvmf volume over it ([metrics]
# listen in the volume file) are scraped twice while fio runs; promtool
# (Prometheus' own parser) accepts every page, and the I/O counters and
# latency histograms of both grew between the two scrapes.
. /vm/lib.sh
. /vm/ublk.sh

require_cmd ublk-nvmf gimbal-target fio promtool wget || exit 1
require_module ublk_drv || exit 1

NQN=nqn.2026-01.io.gimbal:metrics
cat >/tmp/target.toml <<EOC
listen = ["127.0.0.1:4420"]
[metrics]
listen = "127.0.0.1:9750"
[[subsystem]]
nqn = "$NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "128MiB"
qos = "gimbal"
EOC
start_daemon gimbal gimbal-target run --config /tmp/target.toml
listening() { netstat -ltn 2>/dev/null | grep -q "127.0.0.1:$1 "; }
wait_for "gimbal-target listens" 20 listening 4420
wait_for "gimbal-target serves metrics" 20 listening 9750

ublk_volume_config /tmp/mvol.toml mvol 127.0.0.1 4420 $NQN 1 2
printf '[metrics]\nlisten = "127.0.0.1:9751"\n' >>/tmp/mvol.toml
check_output "add a volume with [metrics] listen" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/mvol.toml
wait_for "ublk-nvmf serves metrics" 20 listening 9751
check_output "list: the table names the volume and its target" \
    "^/dev/ublkb0 +mvol +[0-9]+ +127.0.0.1:4420 +$NQN +1 " ublk-nvmf list

# scrape PORT FILE; value FILE SERIES: the sample's value (empty if none).
scrape() { wget -q -O "$2" "http://127.0.0.1:$1/metrics"; }
value() { awk -v s="$2" '$1 == s { print $2 }' "$1"; }
# grew SERIES: its value in the second scrape is above the first's.
grew() {
    _a=$(value "$1" "$3") _b=$(value "$2" "$3")
    log "$3: $_a -> $_b"
    [ -n "$_a" ] && [ -n "$_b" ] && awk -v a="$_a" -v b="$_b" 'BEGIN { exit !(b > a) }'
}

fio --name=load --filename=/dev/ublkb0 --ioengine=libaio --direct=1 --rw=randrw \
    --bs=4k --iodepth=16 --size=64M --time_based --runtime=40 >"$LOGDIR/fio-load.log" 2>&1 &
fio_pid=$!
moving() {
    _w=$(value /tmp/probe.txt 'ublk_nvmf_ios_total{volume="mvol",op="write"}')
    [ -n "$_w" ] && [ "$_w" != 0 ]
}
probe() { scrape 9751 /tmp/probe.txt && moving; }
wait_for "fio's writes reach the volume" 60 probe
check "scrape gimbal-target (1)" scrape 9750 /tmp/g1.txt
check "scrape ublk-nvmf (1)" scrape 9751 /tmp/u1.txt
sleep 5
check "scrape gimbal-target (2)" scrape 9750 /tmp/g2.txt
check "scrape ublk-nvmf (2)" scrape 9751 /tmp/u2.txt
for f in g1 g2 u1 u2; do
    check "promtool check metrics: $f" sh -c "promtool check metrics </tmp/$f.txt"
done

ns='subsystem="'$NQN'",namespace="1"'
for op in read write; do
    check "gimbal-target: $op requests grew" grew /tmp/g1.txt /tmp/g2.txt "gimbal_target_requests_total{$ns,op=\"$op\"}"
    check "gimbal-target: $op bytes grew" grew /tmp/g1.txt /tmp/g2.txt "gimbal_target_request_bytes_total{$ns,op=\"$op\"}"
    check "ublk-nvmf: $op I/Os grew" grew /tmp/u1.txt /tmp/u2.txt "ublk_nvmf_ios_total{volume=\"mvol\",op=\"$op\"}"
    check "ublk-nvmf: $op bytes grew" grew /tmp/u1.txt /tmp/u2.txt "ublk_nvmf_io_bytes_total{volume=\"mvol\",op=\"$op\"}"
    check "ublk-nvmf: $op latency count grew" grew /tmp/u1.txt /tmp/u2.txt "ublk_nvmf_io_latency_seconds_count{volume=\"mvol\",op=\"$op\"}"
done
# The numbers, on the console.
for s in "gimbal_target_requests_total{$ns,op=\"read\"}" "gimbal_target_requests_total{$ns,op=\"write\"}"; do
    log "$s: $(value /tmp/g1.txt "$s") -> $(value /tmp/g2.txt "$s")"
done
for s in 'ublk_nvmf_ios_total{volume="mvol",op="read"}' 'ublk_nvmf_ios_total{volume="mvol",op="write"}' \
    'ublk_nvmf_io_latency_seconds_count{volume="mvol",op="read"}' 'ublk_nvmf_io_latency_seconds_sum{volume="mvol",op="read"}'; do
    log "$s: $(value /tmp/u1.txt "$s") -> $(value /tmp/u2.txt "$s")"
done
check "ublk-nvmf: medium-class I/Os grew" grew /tmp/u1.txt /tmp/u2.txt 'ublk_nvmf_class_ios_total{volume="mvol",class="medium"}'
check_output "gimbal-target: the volume's host is a tenant with a credit" \
    "^gimbal_target_tenant_credit\{$ns,host=\"nqn[^\"]*\"\} [1-9]" cat /tmp/g2.txt
check_output "ublk-nvmf: the window comes from the target's credits" \
    '^ublk_nvmf_credit_window_source\{volume="mvol",source="target"\} 1$' cat /tmp/u2.txt
check_output "ublk-nvmf: the volume's device is named" \
    '^ublk_nvmf_volume_info\{volume="mvol",device="/dev/ublkb0",' cat /tmp/u2.txt
check "fio completes without errors" wait $fio_pid
tail -n 6 "$LOGDIR/fio-load.log"

check "del mvol" ublk-nvmf del mvol
gone() { ! test -e /dev/ublkb0; }
wait_for "/dev/ublkb0 removed" 20 gone
closed() { ! listening 9751; }
wait_for "the volume's metrics listener closed with it" 20 closed
stop_daemon gimbal
