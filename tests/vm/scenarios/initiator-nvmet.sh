# vm-timeout: 420
# Our embedded NVMe/TCP initiator (ublk-nvmf discover/identify/bench)
# against the kernel's nvmet-tcp target, a reference nobody here wrote,
# with a memory-backed null_blk namespace and a file namespace:
# - discover, identify and verified I/O are clean on both;
# - an idle connection outlives 3 x KATO without a reset;
# - unlinking and relinking the subsystem from the port during a verified
#   run makes the initiator reconnect, and the run ends with no error;
# - with the subsystem gone for longer than ctrl_loss_tmo, pending I/O
#   fails with an error instead of hanging.
. /vm/lib.sh
. /vm/nvmet.sh

NULL_NQN=nqn.2026-01.io.test:nvmet-null
FILE_NQN=nqn.2026-01.io.test:nvmet-file
T="-a 127.0.0.1 -s 4420"

require_cmd ublk-nvmf || exit 1
nvmet_init || exit 1
require_module null_blk || exit 1
rmmod null_blk
check "null_blk memory-backed device" modprobe null_blk nr_devices=1 memory_backed=1 gb=1
check "backing file on tmpfs" truncate -s 256M /tmp/nvmet-file.img
setup() {
    nvmet_port 1 127.0.0.1 4420 &&
        nvmet_subsys $NULL_NQN && nvmet_ns $NULL_NQN 1 /dev/nullb0 &&
        nvmet_subsys $FILE_NQN && nvmet_ns $FILE_NQN 1 /tmp/nvmet-file.img &&
        nvmet_link 1 $NULL_NQN && nvmet_link 1 $FILE_NQN
}
check "nvmet: null_blk and file subsystems on 127.0.0.1:4420" setup

check_output "discover lists the null_blk subsystem" "subnqn: +$NULL_NQN" ublk-nvmf discover $T
check_output "discover lists the file subsystem" "subnqn: +$FILE_NQN" ublk-nvmf discover $T
check_output "identify (null_blk): namespace 1" "namespace 1: [0-9]+ blocks of 512 bytes" \
    ublk-nvmf identify $T -n $NULL_NQN
check_output "identify (file): Linux model" "mn +: Linux" ublk-nvmf identify $T -n $FILE_NQN

# bench_ok NAME ARGS...: a bench run whose JSON says no error; keeps the
# JSON in /tmp/NAME.json.
bench_ok() {
    _n=$1
    shift
    ublk-nvmf bench "$@" --json >/tmp/$_n.json || { cat /tmp/$_n.json; return 1; }
    cat /tmp/$_n.json
    grep -q '"errors":0,"verify_errors":0' /tmp/$_n.json
}
for nqn in $NULL_NQN $FILE_NQN; do
    check "bench --verify randrw 4k qd16 on $nqn" bench_ok verify-4k $T -n $nqn \
        --rw randrw --bs 4k --iodepth 16 --numjobs 2 --runtime 3 --size 16m --verify
    check "bench --verify write 128k qd8 with digests on $nqn" bench_ok verify-128k $T -n $nqn \
        --rw write --bs 128k --iodepth 8 --runtime 0 --size 32m --verify --hdgst --ddgst
done
check "bench --verify read 1m (MDTS split) on $FILE_NQN" bench_ok verify-1m $T -n $FILE_NQN \
    --rw read --bs 1m --iodepth 4 --runtime 2 --size 32m --verify

# Idle for more than 3 x KATO (KATO 1 s, idle 4 s), then I/O: no reset, and
# the target saw no keep-alive expiry.
dmesg -c >/dev/null
check "idle connection survives 4 s with KATO 1 s" bench_ok idle $T -n $NULL_NQN \
    --kato 1 --idle 4 --rw randread --bs 4k --runtime 1
check_output "no reset during the idle run" '"resets":0' cat /tmp/idle.json
check_fails "nvmet saw no keep-alive expiry" sh -c 'dmesg | grep -i "keep-alive.*expired"'

# Reconnect: unlink the subsystem from the port during a verified run (the
# target drops its connections), relink it, and the run must finish clean.
start_daemon bench-reconnect sh -c "ublk-nvmf bench $T -n $FILE_NQN --rw randrw --bs 8k \
    --iodepth 16 --runtime 12 --size 16m --verify --json --reconnect-delay 1 \
    --ctrl-loss-tmo 60 >/tmp/reconnect.json; echo \$? >/tmp/reconnect.rc"
sleep 4
check "unlink the file subsystem from the port" nvmet_unlink 1 $FILE_NQN
sleep 2
check "relink it" nvmet_link 1 $FILE_NQN
wait_for "verified run ends after the outage" 90 test -e /tmp/reconnect.rc
check_eq "verified run exits 0" 0 "$(cat /tmp/reconnect.rc 2>/dev/null)"
cat /tmp/reconnect.json
check_output "no verification or I/O error across the reconnect" \
    '"errors":0,"verify_errors":0' cat /tmp/reconnect.json
check_fails "at least one reset was survived" grep -q '"resets":0' /tmp/reconnect.json
stop_daemon bench-reconnect

# ctrl_loss_tmo: the subsystem goes away for good; pending I/O must fail
# (non-zero exit, an error naming the loss), not hang.
start_daemon bench-loss sh -c "ublk-nvmf bench $T -n $FILE_NQN --rw randwrite --bs 4k \
    --iodepth 8 --runtime 60 --size 8m --reconnect-delay 1 --ctrl-loss-tmo 3 \
    2>/tmp/loss.err; echo \$? >/tmp/loss.rc"
sleep 3
check "unlink the file subsystem for good" nvmet_unlink 1 $FILE_NQN
wait_for "run ends once ctrl_loss_tmo has passed" 60 test -e /tmp/loss.rc
check_fails "run exits non-zero" test "$(cat /tmp/loss.rc 2>/dev/null)" = 0
check_output "the error names the controller loss" "controller lost" cat /tmp/loss.err
stop_daemon bench-loss
check "nvmet teardown" nvmet_clear
