# vm-timeout: 240
# The ioprio side channel on the bench's kernel (Debian 6.12, BTF): the
# ioprio-probe binary loads and attaches the BPF program on
# tp_btf/block_rq_issue, registers one null_blk disk, and must see the
# requests of `ionice -c1 -n0` and `ionice -c3` O_DIRECT reads on it with
# their classes; reads on a second, unregistered disk must not show up. With
# the BTF hidden or without privileges, the probe reports the fallback mode
# and its reason instead of loading.
. /vm/lib.sh

require_cmd ioprio-probe ionice dd || exit 1
check "null_blk with two disks" modprobe null_blk nr_devices=2 || exit 1
wait_for "nullb0 and nullb1 appear" 10 test -b /dev/nullb1 || exit 1

check_output "kernel BTF present, program loads: mode bpf" '^mode: bpf$' ioprio-probe status

LOG=$LOGDIR/daemon-probe.log
start_daemon probe ioprio-probe watch /dev/nullb0
wait_for "probe registered nullb0" 60 grep -q '^ready$' "$LOG" || exit 1
grep '^registered' "$LOG"

check "ionice -c1 -n0 O_DIRECT read of nullb0" ionice -c1 -n0 sh -c "dd if=/dev/nullb0 of=/dev/null bs=4096 count=32 iflag=direct"
wait_for "probe saw realtime level 0 on nullb0" 20 \
    grep -Eq '^observed dev=nullb0 hwq=[0-9]+ tag=[0-9]+ ioprio=0x2000 class=rt level=0 nvme=High' "$LOG"

check "ionice -c3 O_DIRECT read of nullb0" ionice -c3 sh -c "dd if=/dev/nullb0 of=/dev/null bs=4096 count=32 iflag=direct"
wait_for "probe saw idle on nullb0" 20 \
    grep -Eq '^observed dev=nullb0 hwq=[0-9]+ tag=[0-9]+ ioprio=0x6000 class=idle level=0 nvme=Low' "$LOG"

# Realtime level 5 appears nowhere else: any level=5 line would come from the
# unregistered disk.
check "ionice -c1 -n5 O_DIRECT read of unregistered nullb1" ionice -c1 -n5 sh -c "dd if=/dev/nullb1 of=/dev/null bs=4096 count=32 iflag=direct"
sleep 2
check "nothing observed for the unregistered disk" sh -c "! grep -q 'level=5' '$LOG'"
check "probe still running" daemon_alive probe
stop_daemon probe
log "probe saw $(grep -c '^observed' "$LOG") slot updates; first lines:"
grep '^observed' "$LOG" | head -n 5

check_output "BTF hidden: fallback with the reason" \
    '^mode: fallback: no kernel BTF at /nonexistent/vmlinux$' \
    ioprio-probe --btf /nonexistent/vmlinux status
check_output "no capabilities: fallback with the reason" \
    '^mode: fallback: missing capability: CAP_BPF and CAP_PERFMON \(or CAP_SYS_ADMIN\)$' \
    ioprio-probe --unprivileged status
check_fails "watch refuses to run in fallback" ioprio-probe --btf /nonexistent/vmlinux watch /dev/nullb0
