# vm-timeout: 300
# Our embedded initiator (ublk-nvmf discover/identify/bench) against our
# own gimbal-target in the guest: discovery, identify, verified I/O on RAM
# and file namespaces, an idle connection past 3 x KATO, and a target
# restart in the middle of a verified run (the initiator reconnects, the run
# ends with no error). The same checks against the kernel's nvmet target
# are in initiator-nvmet.
. /vm/lib.sh
. /vm/gimbal.sh

NQN=nqn.2026-01.io.gimbal:demo
T="-a 127.0.0.1 -s 4420"
require_cmd ublk-nvmf gimbal-target || exit 1

gimbal_write_config
gimbal_start || exit 1

check_output "discover lists our subsystem" "subnqn: +$NQN" ublk-nvmf discover $T
check_output "identify: the model from the config" "gimbal-target vm" ublk-nvmf identify $T -n $NQN
check_output "identify: namespace 1 of 256 MiB" "namespace 1: 524288 blocks of 512 bytes" \
    ublk-nvmf identify $T -n $NQN

bench_ok() {
    _n=$1
    shift
    ublk-nvmf bench "$@" --json >/tmp/$_n.json || { cat /tmp/$_n.json; return 1; }
    cat /tmp/$_n.json
    grep -q '"errors":0,"verify_errors":0' /tmp/$_n.json
}
for ns in 1 2; do
    check "bench --verify randrw 4k qd16 on namespace $ns" bench_ok v4k-$ns $T -n $NQN --nsid $ns \
        --rw randrw --bs 4k --iodepth 16 --numjobs 2 --runtime 3 --size 16m --verify
    check "bench --verify write 128k qd8 with digests on namespace $ns" bench_ok v128k-$ns $T -n $NQN \
        --nsid $ns --rw write --bs 128k --iodepth 8 --runtime 0 --size 32m --verify --hdgst --ddgst
done
check "bench --verify read 1m (MDTS split)" bench_ok v1m $T -n $NQN --nsid 2 \
    --rw read --bs 1m --iodepth 4 --runtime 2 --size 32m --verify

check "idle connection survives 4 s with KATO 1 s" bench_ok idle $T -n $NQN \
    --kato 1 --idle 4 --rw randread --bs 4k --runtime 1
check_output "no reset during the idle run" '"resets":0' cat /tmp/idle.json
check_fails "the target saw no keep-alive timeout" grep -q "keep-alive timeout" /tmp/vm-logs/daemon-gimbal.log

# Restart the target (file namespace survives) in the middle of a verified
# run: the initiator reconnects and resubmits, the run verifies clean.
start_daemon bench-reconnect sh -c "ublk-nvmf bench $T -n $NQN --nsid 2 --rw randrw --bs 8k \
    --iodepth 16 --runtime 12 --size 16m --verify --json --reconnect-delay 1 \
    --ctrl-loss-tmo 60 >/tmp/reconnect.json; echo \$? >/tmp/reconnect.rc"
sleep 4
check "stop the target (SIGTERM)" stop_daemon gimbal TERM
sleep 1
gimbal_start || exit 1
wait_for "verified run ends after the restart" 90 test -e /tmp/reconnect.rc
check_eq "verified run exits 0" 0 "$(cat /tmp/reconnect.rc 2>/dev/null)"
cat /tmp/reconnect.json
check_output "no verification or I/O error across the restart" \
    '"errors":0,"verify_errors":0' cat /tmp/reconnect.json
check_fails "at least one reset was survived" grep -q '"resets":0' /tmp/reconnect.json
stop_daemon bench-reconnect
