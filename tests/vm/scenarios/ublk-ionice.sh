# vm-timeout: 420
# ionice classes through ublk-nvmf (issue 8), functional checks:
# (a) with the BPF side channel (the bench kernel has BTF): status shows
#     mode bpf, DRR from gimbal-target, one I/O queue per class in use
#     (high medium low); O_DIRECT I/O under `ionice -c1`, `ionice -c3` and
#     no ionice lands in the high, low and medium per-class counters, by
#     exactly the number of requests each job made;
# (b) fallbacks, each with the reason in status and I/O still working on
#     the configured class: kernel BTF hidden; a kernel that refuses the
#     program (attached to a tracepoint it does not have); no privileges;
#     `source = "fixed"`;
# (c) the kernel nvmet target offers only round robin: `arbitration =
#     "auto"` runs round robin on one queue; `arbitration = "drr"` is
#     refused with a message that names CAP.AMS.
# Ratios under load are measured by the bench (tests/vm/run --bench
# ublk-ionice), not asserted here.
. /vm/lib.sh
. /vm/nvmet.sh
. /vm/gimbal.sh
. /vm/ublk.sh

require_cmd ublk-nvmf gimbal-target ionice dd || exit 1
require_module ublk_drv || exit 1

GNQN=nqn.2026-01.io.gimbal:ionice
cat >/tmp/gi.toml <<EOC
listen = ["127.0.0.1:4420"]
[[subsystem]]
nqn = "$GNQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "64MiB"
EOC
start_daemon gimbal gimbal-target run --config /tmp/gi.toml
wait_for "gimbal-target listens" 20 gimbal_listening || exit 1

# class_ios JSON CLASS: the class's completed reads+writes.
class_ios() { echo "$1" | grep -o "\"class\":\"$2\",\"ios\":[0-9]*" | cut -d: -f3; }
status_json() { ublk-nvmf status iv --json; }
# io_as COUNT RW [ionice args...]: COUNT 4 KiB O_DIRECT reads (r) or writes
# (w) on /dev/ublkb0, under the given ionice class (none: no ionice).
io_as() {
    _n=$1 _rw=$2
    shift 2
    if [ "$_rw" = r ]; then
        set -- "$@" dd if=/dev/ublkb0 of=/dev/null bs=4096 count="$_n" iflag=direct
    else
        set -- "$@" dd if=/dev/zero of=/dev/ublkb0 bs=4096 count="$_n" oflag=direct
    fi
    [ "$1" = none ] && shift
    "$@" 2>/dev/null
}
# counts_by_class LABEL CLASS_RT CLASS_IDLE CLASS_NONE: 64 reads under
# ionice -c1, 48 writes under -c3 and 32 reads without ionice must add
# exactly to the named classes' counters.
counts_by_class() {
    # Settle: udev and blkid read the new device once.
    sleep 1
    before=$(status_json)
    check "$1: 64 reads under ionice -c1 -n0" io_as 64 r ionice -c1 -n0
    check "$1: 48 writes under ionice -c3" io_as 48 w ionice -c3
    check "$1: 32 reads without ionice" io_as 32 r none
    after=$(status_json)
    log "$1: status after: $after"
    for c in urgent high medium low; do
        eval "want_$c=0"
    done
    eval "want_$2=\$((want_$2 + 64))"
    eval "want_$3=\$((want_$3 + 48))"
    eval "want_$4=\$((want_$4 + 32))"
    for c in urgent high medium low; do
        d=$(($(class_ios "$after" $c) - $(class_ios "$before" $c)))
        eval "w=\$want_$c"
        check_eq "$1: class $c counted the jobs' requests" "$w" "$d"
    done
}
# volume CONFIG_EXTRA: (re)create volume iv on the gimbal namespace.
volume() {
    ublk_volume_config /tmp/iv.toml iv 127.0.0.1 4420 $GNQN 1 1
    printf '%b' "$1" >>/tmp/iv.toml
}
del_volume() {
    check "del iv ($1)" ublk-nvmf del iv
    wait_for "/dev/ublkb0 removed" 20 sh -c '! test -e /dev/ublkb0'
}

# --- (a) the side channel ----------------------------------------------------
volume '[priority]\narbitration = "drr"\nhigh_weight = 4\nmedium_weight = 2\nlow_weight = 1\n'
check_output "(a) add a volume with ionice classes" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/iv.toml
st=$(ublk-nvmf status iv)
echo "$st"
check_output "(a) side channel loaded" '^  priority: bpf \(drr \(vendor specific\)\), queues per ublk queue: high medium low$' echo "$st"
counts_by_class "(a) bpf" high low medium
check_output "(a) no I/O errors" '"errors":0' status_json
del_volume bpf

# --- (b) fallbacks -----------------------------------------------------------
# fallback LABEL ENV PATTERN: the daemon under ENV must report PATTERN and
# count every request in medium (the configured class).
fallback() {
    volume '[priority]\narbitration = "drr"\n'
    check_output "(b) $1: add" "^/dev/ublkb0$" env "$2" ublk-nvmf add --config /tmp/iv.toml
    st=$(ublk-nvmf status iv)
    echo "$st"
    check_output "(b) $1: status names the fallback and its reason" "^  priority: fallback: $3" echo "$st"
    check_output "(b) $1: one queue, the configured class" 'queues per ublk queue: medium$' echo "$st"
    counts_by_class "(b) $1" medium medium medium
    del_volume "$1"
}
fallback "BTF hidden" UBLK_NVMF_IOPRIO_BTF=/nonexistent/vmlinux 'no kernel BTF at /nonexistent/vmlinux'
fallback "kernel refuses the program" UBLK_NVMF_IOPRIO_TRACEPOINT=block_rq_nonexistent 'BPF load failed: '
fallback "no privileges" UBLK_NVMF_IOPRIO_UNPRIVILEGED=1 'missing capability: '
check_output "(b) the reason was logged once by the daemon" 'ioprio side channel unavailable' \
    cat /run/ublk-nvmf/iv.log

volume '[priority]\nsource = "fixed"\nclass = "low"\n'
check_output "(b) fixed class: add" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/iv.toml
st=$(ublk-nvmf status iv)
check_output "(b) fixed class: status" '^  priority: fixed \(low\) \(weighted round robin\), queues per ublk queue: low$' echo "$st"
counts_by_class "(b) fixed" low low low
del_volume fixed

# --- (c) kernel nvmet: round robin only --------------------------------------
KNQN=nqn.2026-01.io.ublk:ionice-nvmet
nvmet_init || exit 1
truncate -s 64M /tmp/nvmet-ionice.img
nvmet_setup() {
    nvmet_port 1 127.0.0.1 4421 && nvmet_subsys $KNQN &&
        nvmet_ns $KNQN 1 /tmp/nvmet-ionice.img && nvmet_link 1 $KNQN
}
check "(c) nvmet: file namespace on port 4421" nvmet_setup
ublk_volume_config /tmp/iv.toml iv 127.0.0.1 4421 $KNQN 1 1
check_output "(c) auto arbitration on nvmet: add" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/iv.toml
st=$(ublk-nvmf status iv)
echo "$st"
check_output "(c) nvmet runs round robin on one queue" '\(round robin\), queues per ublk queue: medium$' echo "$st"
counts_by_class "(c) nvmet" high low medium
del_volume nvmet
printf '[priority]\narbitration = "drr"\n' >>/tmp/iv.toml
check_output "(c) drr on nvmet is refused, naming CAP.AMS" 'not in CAP.AMS' \
    sh -c 'ublk-nvmf run --config /tmp/iv.toml 2>&1; true'
check "(c) no device left behind" sh -c '! test -e /dev/ublkb0'

stop_daemon gimbal
finish
