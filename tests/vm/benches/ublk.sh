# vm-timeout: 4200
# vm-mem: 4096
# The benchmark matrix of issue 14: is the default ublk-nvmf path at least
# as fast as the kernel NVMe/TCP host, and does its default credit mode
# still protect a latency-sensitive tenant? One guest run, BENCH_ROUNDS
# (default 3) rounds. Run:
#   tests/vm/run --bench ublk                     # ~18 min
#   BENCH_ROUNDS=1 BENCH_SECS=3 BENCH_TENANT_SECS=5 tests/vm/run --bench ublk   # a quick look
# BENCH_ONLY=matrix, tenants, profile, interleave, climb, offset or versus
# runs one part (the last four, parts 4-7, run only when asked for);
# BENCH_JOBS=JOB,...
# (names as in the BENCH lines, e.g. 128k-write-qd32) runs only those
# matrix jobs; the BENCH lines
# land in target/vm/bench/ublk.txt; docs/benchmarks.md records the runs.
#
# Part 1, the matrix. Hosts of one gimbal-target `null` namespace (nsid 3)
# on loopback:
#   ublk              the default config (credits = "auto": the plain
#                     target sends no credits, so the latency estimate
#                     runs), 1 queue, depth 128
#   ublk-credits-off  the same with credits = "off"
#   kernel            the kernel host (nvme connect; one I/O queue per vCPU)
#   ublk-copy         with BENCH_COPY=1: credits off and [io] zero_copy =
#                     "off" (the copy through the tag buffers), for the
#                     one-queue jobs, to see what zero copy changes
# BENCH_Q2=1 runs the one-job jobs on the queues = 2 volumes instead (the
# kernel host has one I/O queue per vCPU); BENCH_Q2=both runs them on
# both, the queues = 2 volumes with credits off only (host ublk-q2-off).
#   ublk-q2-off       with BENCH_Q2=both: credits off on the queues = 2
#                     volumes, beside the one-queue volumes' runs
#   ublk-wait-off     with BENCH_WAIT=SIZE, read jobs only: both volumes
#                     with credits off and read_wait_min=SIZE (a read's
#                     data of SIZE or more still due taken in one receive
#                     that waits for all of it; default 256k), to A/B it
#                     against ublk-credits-off
#   ublk-noheads-off  with BENCH_HEADS=1 (not with BENCH_FIXED), write
#                     jobs only: both volumes with credits off and
#                     head_copy_min=max (a spliced write's PDU headers
#                     sent from the send buffer, a sendmsg between two
#                     splices, instead of spliced with its data from
#                     per-tag copies), to A/B the copies against
#                     ublk-credits-off
#   ublk-fixed        with BENCH_FIXED=1, write jobs only: both volumes
#                     at the default but with write_pages_min=32k (a
#                     large write sent from the request's pages with
#                     WRITE_FIXED instead of read into our buffer and
#                     spliced), to A/B how zero copy sends large writes
# BENCH_PROBE_LOG=1 has volumes ublka and ublkb log every gain probe's
# comparison (RUST_LOG ublk_target::qos=debug) and prints those of each
# default run after it (`probe ROUND JOB HOST |` lines, console log).
# The two ublk modes are not two volumes but two volumes in both modes:
# volumes `ublka` and `ublkb` (`ublkq2a`/`ublkq2b` with queues = 2) each
# run every job once with the default and once with credits off
# (`ublk-nvmf set NAME credits=...` before each run), as hosts ublk-a,
# ublk-b, ublk-credits-off-a and ublk-credits-off-b. Why: two identically
# configured volumes differed by a persistent 10-25 % (the A/A control at
# cef625c, docs/benchmarks.md), so a ratio of two volumes measured the
# volumes, not the modes. (Part 6 finds no such offset between two fresh
# volumes that run nothing but its job, renewed or not; but the matrix
# still shows one at times, tied to a job, after the volumes' earlier
# jobs: docs/benchmarks.md, 2026-11-29, fifth. Part of the A/A spread is
# the host's drift between runs, which the order in matrix_job cancels.) Here
# each volume is its own control: the hosts `ublk` and `ublk-credits-off`
# in the ratios are the geometric means of the two volumes' runs in that
# mode, in which a volume's offset, if any, cancels from default/off
# exactly and is halved in ublk/kernel;
# ublk-credits-off-a/ublk-credits-off-b is the A/A ratio, and
# ublk-a/ublk-credits-off-a, ublk-b/ublk-credits-off-b show whether the
# two volumes agree on default/off.
# The jobs, fio (libaio, direct, BENCH_SECS (8) measured after 2 s
# warm-up): 4k randread, 4k randwrite, 128k read, 128k write, 1M read
# (sequential), all QD 32; 4k randread QD 1 and QD 128; and the
# multi-queue case, two fio jobs of 4k randread QD 32 reported together,
# on the queues = 2 volumes and on the kernel host. In every round each
# job runs on the hosts back to back (ublk-a, ublk-credits-off-a, kernel,
# ublk-credits-off-b, ublk-b; reversed in even rounds: mirrored around the
# kernel host; each volume's two modes swapped in rounds 3-4, 7-8, ...;
# see matrix_job), so the host's drift falls on all alike;
# ratios are only taken within a round. For
# every job: the ratios per round (IOPS for 4k jobs, MiB/s for the rest),
# then their median and spread (min-max) across rounds, with the issue's
# goal where it sets one (a report, not a check).
#
# Part 2, two tenants on one simulated SSD (issue 14's protection case).
# A second gimbal-target (port 4421) serves a `sim` namespace with
# qos = "none": a plain target that sends no credits. Two ublk volumes on
# that namespace: a latency-sensitive reader (4k randread, QD 1) and a
# writer (4k randwrite, QD 128), run together for BENCH_TENANT_SECS (20)
# after BENCH_TENANT_RAMP (5) s of warm-up; once with both volumes at the
# default, once with both set to credits = "off" (the same two volumes,
# so that no volume offset enters the ratios), in every round (in this
# order in odd rounds, reversed in even ones; the tenant rounds run after
# all matrix rounds, see below). Reported: the reader's p99 and IOPS, the writer's IOPS and MiB/s, the total bytes/s of
# both; then reader p99 default/off (goal <= 0.5) and total default/off
# (goal >= 0.9) per round, median and spread. Then the same rounds with
# the kernel's NVMe/TCP host as the reader ("a volume beside a second
# client": case=second-client in the BENCH lines), which no gate of ours
# sees.
# Memory: the guest gets 4 GiB (the vm-mem header). With 2 GiB, on Debian
# 6.18's larger initramfs, the sim target (it keeps what the writer wrote,
# up to 512 MiB) and later ublk-nvmf (~280 MiB of tag buffers over its
# volumes) were OOM-killed in round 2-3, and the run then waited for its
# time limit.
# Device settings, and why:
# - profile "fragmented", time_scale BENCH_SCALE (50). The fragmented
#   model sustains ~186 MB/s of 4 KiB random writes (write amplification
#   5: each 16 KiB program carries ~2.3 ms of GC copies), i.e. ~910
#   writes/s at 50x: 5-18x below the 4k IOPS the guest moves through
#   ublk-nvmf or the kernel host on `null` (5,000-17,000, docs/benchmarks.md),
#   so the device, not the guest's CPU, is the bottleneck for the writer.
#   writer_device_share in the BENCH line is the writer's IOPS over that
#   model maximum (~1.0 when the device is saturated; well below 1 means
#   the guest or the window limited it).
# - 4k writes rather than larger ones: with a full write buffer every
#   waiting write forces its program (and GC) onto a die, and a read that
#   lands on that die waits for the whole job. 128 waiting 4k writes are
#   ~32 programs, about one per die, so the QD 1 reader nearly always waits
#   behind one: p99 ~3 ms of device time against ~0.2 ms with a few writes
#   in flight, while 4 in flight already keep the device's write rate
#   (the model, QD 1 reader + writer at 20 us of path per I/O: writer
#   window 128 -> reader p99 2,950 us, 183 MB/s; 4-8 -> 205-315 us, 183
#   MB/s). So the case has room for a window that protects the reader at
#   full throughput. A 128k writer at QD 128 queues 8 programs per write:
#   reader p99 ~17 ms of device time, i.e. seconds at any scale where the
#   device stays the bottleneck, leaving the reader a handful of samples.
# - device_queue_depth is left unlimited: every command reaches the model
#   at once, as on an SSD with a deep queue, and reads overtake writes the
#   way the model's dies allow (a read waits for die work, not behind all
#   queued writes in a target FIFO).
# - At 50x an unloaded 4k read takes ~4.3 ms, and ~80 ms behind the QD 128
#   writer with credits off: ~12 reads/s, ~240 samples in 20 s. The
#   reader's latency also holds the guest's own path (4k QD 1 on `null`:
#   5-10 ms per read on a loaded host), which bounds how low default/off
#   can go; a higher BENCH_SCALE widens the device's share, at fewer
#   samples.
# Two namespaces would be two devices (each `sim` namespace has a model of
# its own), so both tenants use the one namespace through two volumes.
#
# Part 3, with BENCH_PERF=1 (the runner then puts perf in the guest): where
# the guest's CPU time goes (issue 14: find it before changing the data
# path). For 128k read, 128k write, 4k randread and 1M read, QD 32, on
# ublk-credits-off and the kernel host: `perf record -a -g` (cpu-clock,
# 499 Hz: TCG has no PMU) over BENCH_SECS of the job, then the share of
# samples by command, by command and binary, by kernel/user symbol, by
# gimbal-target's own symbols and by ublk-nvmf's (self time, >= 1 % of all
# samples), as
# "BENCH profile host=... job=... by=comm|comm,dso|sym|target-sym|client-sym
# share=... name=..." lines; and, counted over the same seconds by `perf
# stat`, each process's system calls per second and per fio I/O
# ("by=events comm=... event=... per_sec=... per_io=..."), and each busy
# thread's CPU time, wait for a CPU and times scheduled in, from its
# schedstat ("by=thread comm=... on_cpu=... slices_per_io=..."). Context
# switches are counted from schedstat, not the sched_switch tracepoint:
# each tracepoint switched on or off rewrites the kernel's text, and the
# guest's kernel dies of an int3 oops now and then when the code it
# rewrites is __schedule's (three profile runs of 2026-12-01 in four);
# BENCH_SWITCHES=1 adds the kernel stacks threads switch out on (a
# sched_switch record after the window, console log).
# the read data waiting unread in the client's sockets, sampled over the
# window ("by=unread samples=... over_256k=... median=..."; a host that
# keeps up has little);
# for our host also the volume's socket sends, receives and direct
# receives per I/O from its status ("by=socket sends_per_io=...
# receives_per_io=... direct_per_io=... waited_per_io=..."), and for
# every host the guest's TCP counters that moved over those seconds, per
# I/O ("by=tcp counter=TcpExt:DelayedACKs per_sec=... per_io=...").
# BENCH_ONLY=profile runs only this part (with part 1's setup); it
# honours BENCH_JOBS, and with BENCH_FIXED=1 profiles the 128k write a
# third time as host ublk-fixed-off (credits off, write_pages_min=32k),
# with BENCH_HEADS=1 as host ublk-noheads-off (credits off,
# head_copy_min=max), with BENCH_WAIT=SIZE the reads as host
# ublk-wait-off (credits off, read_wait_min=SIZE).
#
# After every ublk run a "BENCH gate" line: what the credit gate held in
# it and the lower bound on default/off that follows (gate_line), and
# per job a "BENCH gate summary".
#
# Afterwards `ublk-nvmf status` of every volume (credit window and its
# source). Benchmarks report; only fio errors and setup fail the run.
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/ublk.sh

SECS=${BENCH_SECS:-8}
ROUNDS=${BENCH_ROUNDS:-3}
TSECS=${BENCH_TENANT_SECS:-20}
TRAMP=${BENCH_TENANT_RAMP:-5}
SCALE=${BENCH_SCALE:-50}
ONLY=${BENCH_ONLY:-}
NQN=nqn.2026-01.io.gimbal:demo
SIM_NQN=nqn.2026-01.io.gimbal:sim
# 4 KiB random writes per second of device time the fragmented model
# sustains at QD 128 (186 MB/s, qos-core ssd_model calibration).
SIM_WRITE_IOPS=45400
FIO_BENCH_OUT=/tmp/bench.txt
: >"$FIO_BENCH_OUT"

require_cmd ublk-nvmf gimbal-target fio || exit 1
require_module ublk_drv nvme-tcp || exit 1
# Both add hosts in a write job's two outer places of the round, so one
# would replace the other's without a word.
if [ -n "${BENCH_FIXED:-}" ] && [ -n "${BENCH_HEADS:-}" ]; then
    fail "BENCH_FIXED and BENCH_HEADS take the same places in a write job's round: set one"
    exit 1
fi
# The socket dumps' buffers and windows: without tcp_diag ss reads
# /proc/net/tcp and shows neither (the dumps are diagnostics, so no check).
modprobe tcp_diag 2>/dev/null || log "no tcp_diag: socket dumps show no buffers"

VOLUMES=""
# volume VAR NAME PORT SUBNQN NSID QUEUES auto|off [copy]: adds a volume
# (copy: without zero copy) and sets
# VAR to its device.
volume() {
    _conf=/tmp/vol-$2.toml
    ublk_volume_config "$_conf" "$2" 127.0.0.1 "$3" "$4" "$5" "$6"
    [ "$7" = off ] && printf '[qos]\ncredits = "off"\n' >>"$_conf"
    [ "${8:-}" = copy ] && sed -i 's/^\[io\]$/[io]\nzero_copy = "off"/' "$_conf"
    _dev=$(ublk-nvmf add --config "$_conf" 2>"$LOGDIR/add-$2.log")
    case "$_dev" in
    /dev/ublkb[0-9]*)
        pass "volume $2 ($6 queue(s), credits $7): $_dev"
        eval "$1=$_dev"
        case " $VOLUMES " in *" $2 "*) ;; *) VOLUMES="$VOLUMES $2" ;; esac
        ;;
    *)
        fail "volume $2: ublk-nvmf add printed '$_dev'"
        tail -n 20 "$LOGDIR/add-$2.log" | sed 's/^/    | /'
        return 1
        ;;
    esac
}

# set_mode VOLUME auto|off: the volume's credit mode for the next run.
# MODE is a credit mode, or `fixed`: the default credits with a large
# zero-copy write sent from the request's pages (write_pages_min=32k)
# instead of read into our buffer and spliced (BENCH_FIXED=1); `fixed-off`
# the same with credits off (profiles); every other mode sets the
# default, max. `wait-off`: credits off, and a read's data of BENCH_WAIT
# or more received in one receive that waits for all of it
# (read_wait_min=BENCH_WAIT); `heads-off`: credits off, and a spliced
# write's PDU headers sent apart from its data (head_copy_min=max,
# BENCH_HEADS=1); every other mode sets its default.
set_mode() {
    _c=$2 _p=max _w=default _hc=default
    [ "$2" = fixed ] && _c=auto _p=32k
    [ "$2" = fixed-off ] && _c=off _p=32k
    [ "$2" = wait-off ] && _c=off _w=$BENCH_WAIT
    [ "$2" = heads-off ] && _c=off _hc=max
    _o=$(ublk-nvmf set "$1" credits="$_c" write_pages_min="$_p" read_wait_min="$_w" head_copy_min="$_hc" 2>&1)
    case "$_o" in
    credits="$_c"*) ;;
    *)
        fail "ublk-nvmf set $1 credits=$_c write_pages_min=$_p read_wait_min=$_w head_copy_min=$_hc: $_o"
        return 1
        ;;
    esac
}

# --- part 1 setup: null namespace, four volumes, the kernel host ---------
if [ -z "$ONLY" ] || [ "$ONLY" = matrix ] || [ "$ONLY" = profile ] || [ "$ONLY" = interleave ] || [ "$ONLY" = climb ] || [ "$ONLY" = offset ] || [ "$ONLY" = versus ]; then
    gimbal_write_config
    gimbal_start || exit 1
    # BENCH_PROBE_LOG=1: the default volumes log every gain probe's
    # comparison, shown after each default run (the probes' noise).
    [ -n "${BENCH_PROBE_LOG:-}" ] && export RUST_LOG=info,ublk_target::qos=debug
    volume D_A ublka 4420 $NQN 3 1 auto || exit 1
    volume D_B ublkb 4420 $NQN 3 1 auto || exit 1
    unset RUST_LOG
    volume D_A2 ublkq2a 4420 $NQN 3 2 auto || exit 1
    volume D_B2 ublkq2b 4420 $NQN 3 2 auto || exit 1
    if [ -n "${BENCH_COPY:-}" ]; then volume D_COPY ublkcopy 4420 $NQN 3 1 off copy || exit 1; fi
    check "kernel host connects" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN || exit 1
    wait_for "kernel host namespaces appear" 20 nvme_ns_dev $NQN 3 || exit 1
    KDEV=$(nvme_ns_dev $NQN 3)
    log "null namespace: ublka $D_A, ublkb $D_B, queues=2: ublkq2a $D_A2 / ublkq2b $D_B2, kernel $KDEV ($(ls /sys/block/${KDEV#/dev/}/mq | wc -l) hardware queues)"
    # Where a clock read goes: only tsc (and paravirtual clocks) are read
    # in the vDSO; with hpet or acpi_pm every clock_gettime of ours and of
    # fio is a system call.
    log "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>&1) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource 2>&1))"
fi

# --- part 2 setup: the sim device on a second target, four volumes -------
if [ -z "$ONLY" ] || [ "$ONLY" = tenants ]; then
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
    # The tenants' servers log every gain probe's comparison (own
    # throughput, the neighbour's latency), shown after their rounds.
    export RUST_LOG=info,ublk_target::qos=debug
    volume R_DEV reader 4421 $SIM_NQN 1 1 auto || exit 1
    volume W_DEV writer 4421 $SIM_NQN 1 1 auto || exit 1
    unset RUST_LOG
fi

# matrix_job ROUND JOB RW BS QD [JOBS]: JOB on every host back to back.
# Odd rounds run them in the order [ublk-fixed-a,] ublk-a,
# ublk-credits-off-a, kernel[, ublk-copy], ublk-credits-off-b, ublk-b[,
# ublk-fixed-b], even rounds in the reverse order. Why this order: this
# host's speed drifts over tens of seconds (the kernel host's 4k randread
# moved by 2.4x between rounds at 306f516), while two fresh volumes
# measured back to back differ by only a few per cent (BENCH_ONLY=offset,
# docs/benchmarks.md, 2026-11-29, fifth). So each volume's two modes run
# next to each other, and the order is mirrored around the kernel host:
# every mode's two runs sit as far before the kernel host's as after it,
# and a drift that is steady within the round cancels from every ratio
# of the round's geometric means (default/off, ublk/kernel, off/kernel),
# not only over a pair of rounds. The reversal in even rounds still
# alternates which volume runs first. Rounds 3-4, 7-8, ... swap each
# volume's two modes (credits off at the round's ends, the default next
# to the kernel host): in rounds 1-2 alone the default runs always had
# the ends and credits off the places beside the kernel host, so a cost
# of a place (a round's first run after another job's last, say) fell on
# default/off as if it were the gate's (a three-round run's 128k write
# default/off 0.908 with the gate's bound at 0.992, docs/benchmarks.md,
# 2026-12-01, third). Over every four rounds each mode has each place
# equally often. Then the round's `ublk` and `ublk-credits-off` lines:
# the geometric means of the two volumes in that mode.
matrix_job() {
    _r=$1 _j=$2 _rw=$3 _bs=$4 _qd=$5 _n=${6:-1}
    case ",${BENCH_JOBS:-$_j}," in *",$_j,"*) ;; *) return 0 ;; esac
    # BENCH_Q2=1: every job on the queues = 2 volumes (the kernel host has
    # one I/O queue per vCPU, and one fio job's requests follow its CPU).
    # BENCH_Q2=both: the one-job jobs on both, the queues = 2 volumes with
    # credits off only (hosts ublk-q2-off-a/-b), next to the one-queue
    # volumes' credits-off runs: one socket against two in the same round.
    _q2a="" _q2b=""
    if [ "${BENCH_Q2:-}" = both ] && [ "$_n" = 1 ]; then
        _q2a="ublk-q2-off-a=ublkq2a:off:$D_A2" _q2b="ublk-q2-off-b=ublkq2b:off:$D_B2"
    fi
    if [ "$_n" -gt 1 ] || { [ -n "${BENCH_Q2:-}" ] && [ "$BENCH_Q2" != both ]; }; then
        _va=ublkq2a _vb=ublkq2b _a=$D_A2 _b=$D_B2
    else
        _va=ublka _vb=ublkb _a=$D_A _b=$D_B
    fi
    # host=volume:mode:device (volume and mode empty for the kernel host).
    # Mirrored around the kernel host: volume a's runs, the kernel host,
    # then b's in the opposite order (see above).
    _fa="" _fb="" _copy=""
    case "${BENCH_FIXED:-}:$_rw" in
    1:*write) _fa="ublk-fixed-a=$_va:fixed:$_a" _fb="ublk-fixed-b=$_vb:fixed:$_b" ;;
    esac
    case "${BENCH_WAIT:+set}:$_rw" in
    set:*read) _fa="ublk-wait-off-a=$_va:wait-off:$_a" _fb="ublk-wait-off-b=$_vb:wait-off:$_b" ;;
    esac
    case "${BENCH_HEADS:-}:$_rw" in
    1:*write) _fa="ublk-noheads-off-a=$_va:heads-off:$_a" _fb="ublk-noheads-off-b=$_vb:heads-off:$_b" ;;
    esac
    [ -n "${BENCH_COPY:-}" ] && [ "$_n" = 1 ] && _copy="ublk-copy=::$D_COPY"
    _ua="ublk-a=$_va:auto:$_a" _oa="ublk-credits-off-a=$_va:off:$_a"
    _ub="ublk-b=$_vb:auto:$_b" _ob="ublk-credits-off-b=$_vb:off:$_b"
    if [ $(((_r - 1) / 2 % 2)) -eq 0 ]; then
        _hosts="$_fa $_ua $_oa $_q2a kernel=::$KDEV $_copy $_q2b $_ob $_ub $_fb"
    else
        _hosts="$_fa $_oa $_ua $_q2a kernel=::$KDEV $_copy $_q2b $_ub $_ob $_fb"
    fi
    [ $((_r % 2)) -eq 0 ] && _hosts=$(printf '%s\n' $_hosts | tac | tr '\n' ' ')
    for _h in $_hosts; do
        _spec=${_h#*=}
        _vol=${_spec%%:*} _spec=${_spec#*:}
        _mode=${_spec%%:*} _dev=${_spec#*:}
        if [ -n "$_vol" ]; then set_mode "$_vol" "$_mode" || continue; fi
        tcp_counters >/dev/null
        [ -n "$_vol" ] && _g0=$(gate_counts "$_vol") && _u0=$(uptime_ms)
        if [ -n "${BENCH_PROBE_LOG:-}" ] && [ -n "$_vol" ]; then
            _plog="${UBLK_NVMF_RUN_DIR:-/run/ublk-nvmf}/$_vol.log"
            _pl0=$(wc -l <"$_plog" 2>/dev/null || echo 0)
        fi
        fio_bench "round=$_r host=${_h%%=*} job=$_j" "$_dev" "$_rw" "$_bs" "$_qd" "$SECS" "$_n"
        [ -n "$_vol" ] && _u1=$(uptime_ms) && _g1=$(gate_counts "$_vol")
        log "round $_r $_j ${_h%%=*} tcp: $(tcp_counters)"
        [ -n "$_vol" ] && gate_line "$_r" "${_h%%=*}" "$_j" "$_mode" "$_g0" "$_g1" $((_qd * _n)) $((_u1 - _u0))
        # Where a default run's estimate stood at its end (console log): a
        # default/off ratio below 1 is read against its window and gain.
        if [ "$_mode" = auto ]; then
            log "round $_r $_j, $_vol after: $(ublk-nvmf status "$_vol" 2>&1 | grep -m1 'qos: credits' | sed 's/^ *//')"
            if [ -n "${BENCH_PROBE_LOG:-}" ]; then
                tail -n +$((_pl0 + 1)) "$_plog" 2>/dev/null | grep -a 'probe \(up\|down\) from gain' |
                    sed "s/^/    probe $_r $_j ${_h%%=*} | /"
            fi
        fi
    done
    for _m in ublk ublk-credits-off ublk-fixed ublk-q2-off ublk-wait-off ublk-noheads-off; do
        # sqrt by Newton: the guest's busybox awk has no math functions.
        awk -v r="$_r" -v j="$_j" -v m="$_m" '
            function root(x, y, i) { if (x <= 0) return 0; y = x; for (i = 0; i < 80; i++) y = (y + x / y) / 2; return y }
            { delete v; for (i = 2; i <= NF; i++) { split($i, a, "="); v[a[1]] = a[2] } }
            v["round"] == r && v["job"] == j && (v["host"] == m "-a" || v["host"] == m "-b") {
                n++; io = (n == 1) ? v["iops"] : io * v["iops"]; mb = (n == 1) ? v["mibps"] : mb * v["mibps"] }
            END { if (n == 2) printf "BENCH round=%s host=%s job=%s iops=%d mibps=%.1f\n", r, m, j, root(io), root(mb) }' \
            "$FIO_BENCH_OUT" | tee -a "$FIO_BENCH_OUT"
    done
}

# uptime_ms: the guest's clock in ms (busybox date has no %N).
uptime_ms() { awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime; }

# gate_counts VOLUME: "admitted waited total_us" of the volume's QoS gate
# so far (its status line "waited W of A (mean M us, max X us, total T
# us)").
gate_counts() {
    ublk-nvmf status "$1" 2>/dev/null |
        sed -n 's/.*waited \([0-9]*\) of \([0-9]*\) (.* total \([0-9]*\) us).*/\2 \1 \3/p' | head -n 1
}

# socket_counts VOLUME: "sends receives direct waited" of the volume so
# far (its status line "sends S (B bytes spliced), receives R (D direct,
# W waited)").
socket_counts() {
    ublk-nvmf status "$1" 2>/dev/null |
        sed -n 's/.*sends \([0-9]*\) ([0-9]* bytes spliced), receives \([0-9]*\) (\([0-9]*\) direct, \([0-9]*\) waited).*/\1 \2 \3 \4/p' | head -n 1
}

# tcp_counts: the guest's TCP counters (/proc/net/snmp's Tcp and
# /proc/net/netstat's TcpExt) as "Tcp:Name value" lines.
tcp_counts() {
    awk '$1 == "Tcp:" || $1 == "TcpExt:" { if (hdr[$1] == "") { hdr[$1] = $0; next }
            split(hdr[$1], h); for (i = 2; i <= NF; i++) print $1 h[i], $i; hdr[$1] = "" }' \
        /proc/net/snmp /proc/net/netstat 2>/dev/null
}

# gate_line ROUND HOST JOB MODE BEFORE AFTER REQUESTS GATED_MS: what the
# gate did in one run (BEFORE/AFTER from gate_counts): requests admitted,
# how many waited in the local queue for a credit or the limiter, their
# mean wait, and the bound below. Why: a default/off ratio below 1 is the
# gate's doing only if the gate held requests in that run; with none
# held, both modes sent every request the moment it came, and the ratio
# is the run-to-run noise (issue 14, goal 1).
# The bound: fio keeps REQUESTS (iodepth x jobs) outstanding, and for
# GATED_MS of the run the gate was in force. By Little's law the share of
# those requests that sat in the gate rather than in the path is the
# wait total over REQUESTS x GATED_MS (gate_share); the path then held
# (1 - gate_share) of them, and a path with fewer requests in it is no
# slower per request (a queue), so default/off >= 1 - gate_share, whatever
# the host's noise does to the measured ratio. The assumption: the path's
# throughput is concave in the requests in it (each added request adds
# no more than the one before; what the gain probe relies on too), so its
# throughput per request does not fall as requests are taken out. GATED_MS
# runs from before fio starts to its exit: fio's start-up (under a
# second) makes the share a few per cent (relative) smaller than it is.
# Left out: the estimate's own CPU, counted in instructions by
# examples/client_path_cost.rs.
# "BENCH gate" lines, which the ratio parsers skip.
gate_line() {
    printf '%s %s\n' "$5" "$6" | awk -v r="$1" -v h="$2" -v j="$3" -v m="$4" -v n="$7" -v ms="$8" '
        NF == 6 { a = $4 - $1; w = $5 - $2; t = $6 - $3; sh = (n > 0 && ms > 0) ? t / (n * ms * 1000) : 0
            printf "BENCH gate round=%s on=%s job=%s mode=%s admitted=%d held=%d held_pct=%.2f held_mean_us=%d wait_us=%.0f requests=%d gated_ms=%d gate_share=%.4f bound=%.3f\n",
                r, h, j, m, a, w, (a > 0) ? 100 * w / a : 0, (w > 0) ? t / w : 0, t, n, ms, sh, 1 - sh }' | tee -a "$FIO_BENCH_OUT"
}

# tenant_fio OUT DEV RW QD: one tenant's timed 4k fio run, terse v3 to OUT.
tenant_fio() {
    fio --name=t --filename="$2" --ioengine=libaio --direct=1 --rw="$3" --bs=4k \
        --iodepth="$4" --runtime="$TSECS" --time_based --ramp_time="$TRAMP" --size=512M \
        --randrepeat=0 --norandommap --output-format=terse --terse-version=3 >"$1" 2>&1
}

# tenants ROUND MODE READER_DEV WRITER_DEV [CASE]: the reader and the
# writer together, both volumes set to MODE (default: auto). CASE
# two-tenants (the default): the reader is volume `reader`; second-client:
# it is the kernel host's device, and only the writer's mode changes.
tenants() {
    _case=${5:-two-tenants}
    if [ "$2" = default ]; then _m=auto; else _m=$2; fi
    if [ "$_case" = two-tenants ]; then set_mode reader $_m || return 1; fi
    set_mode writer $_m || return 1
    tenant_fio /tmp/tw.out "$4" randwrite 128 &
    _p=$!
    tenant_fio /tmp/tr.out "$3" randread 1
    _rc=$?
    wait $_p
    _wrc=$?
    if [ $_rc -ne 0 ] || [ $_wrc -ne 0 ] || ! grep -q '^3;' /tmp/tr.out || ! grep -q '^3;' /tmp/tw.out; then
        fail "$_case, round $1, credits $2 (reader exit $_rc, writer exit $_wrc)"
        tail -n 5 /tmp/tr.out /tmp/tw.out | sed 's/^/    | /'
        return 1
    fi
    pass "$_case, round $1, credits $2"
    # Where the writer's estimate stood (a reader p99 ratio is read
    # against the writer's gain: a young writer climbs by probes).
    [ "$2" = default ] && log "round $1 $_case, writer after: $(ublk-nvmf status writer 2>&1 | grep -m1 'qos: credits' | sed 's/^ *//')"
    # Terse v3: 6/7/8 read KiB, KiB/s, IOPS, 18..37 read clat percentiles;
    # 47/48/49 and 59..78 the same for writes.
    {
        grep '^3;' /tmp/tr.out | sed 's/^/R;/'
        grep '^3;' /tmp/tw.out | sed 's/^/W;/'
    } | awk -F';' -v r="$1" -v m="$2" -v c="$_case" -v sc="$SCALE" -v max="$SIM_WRITE_IOPS" '
        function p99(from, i, a) { for (i = from; i < from + 20; i++) if ($i ~ /^99\.000000%=/) { split($i, a, "="); return a[2] } return 0 }
        # Fields are shifted by one by the R;/W; prefix.
        $1 == "R" { rk = $8; ri = $9; rp = p99(19) }
        $1 == "W" { wk = $49; wi = $50; wp = p99(60) }
        END {
            printf "BENCH round=%s tenants=%s case=%s reader_iops=%d reader_p99_us=%d writer_iops=%d writer_mibps=%.2f writer_p99_us=%d total_kibps=%d writer_device_share=%.2f\n",
                r, m, c, ri, rp, wi, wk / 1024, wp, rk + wk, wi * sc / max }' | tee -a "$FIO_BENCH_OUT"
}

# placement WHEN: where each matrix volume's threads and memory are (console
# log), to find what gives one volume a persistent offset over its twin:
# per thread the CPU it last ran on, its allowed CPUs, CPU time (ticks)
# and context switches (voluntary/involuntary); per process the
# transparent huge pages among its anonymous memory.
placement() {
    for _v in ublka ublkb ublkq2a ublkq2b; do
        # (No pgrep in the guest.)
        _pid=""
        for _p in /proc/[0-9]*; do
            case "$(tr '\0' ' ' <"$_p/cmdline" 2>/dev/null)" in
            *"run --config /tmp/vol-$_v.toml"*) _pid=${_p#/proc/} && break ;;
            esac
        done
        [ -n "$_pid" ] || continue
        echo "---- placement $1: $_v pid $_pid, $(grep -E '^(Rss|AnonHugePages):' /proc/$_pid/smaps_rollup 2>/dev/null | tr -s ' ' | tr '\n' ' ')"
        for _t in /proc/$_pid/task/*; do
            awk -v t="${_t##*/}" '{ sub(/^.*\) /, ""); printf "  tid %s cpu %s ticks %d", t, $37, $12 + $13 }' "$_t/stat"
            printf ' %s allowed %s ctxt %s/%s\n' "$(cat "$_t/comm")" \
                "$(awk '/^Cpus_allowed_list/ { print $2 }' "$_t/status")" \
                "$(awk '/^voluntary_ctxt/ { print $2 }' "$_t/status")" \
                "$(awk '/^nonvoluntary_ctxt/ { print $2 }' "$_t/status")"
        done
    done
}

# sockets WHEN: the TCP state of every client connection to the null
# target (port 4420; console log), with its process: congestion window,
# slow-start threshold, retransmissions, buffers. TCP keeps these per
# connection (a connection that once lost packets keeps a lower ssthresh
# and slow-starts to it after every idle period), so a volume's
# connections may differ from its twin's for the whole run.
sockets() {
    command -v ss >/dev/null 2>&1 || return 0
    echo "---- sockets $1 ----"
    ss -tinpm state established '( dport = :4420 )' 2>&1 | head -n 400
    # The target's ends: skmem's d is the socket's own drop count, the
    # receiver that pruned or dropped.
    echo "---- target sockets $1 ----"
    ss -tinpm state established '( sport = :4420 )' 2>&1 | head -n 400
    # Loopback drops only at a full receive queue: the guest's counts so far.
    if command -v nstat >/dev/null 2>&1; then
        nstat -az 2>/dev/null | grep -E 'TcpRetransSegs|RcvQDrop|BacklogDrop|Prune|OFODrop|TCPLossProbes' | tr -s ' ' | tr '\n' ';'
        echo
    fi
}

# tcp_counters: the guest's loss and receive-queue counters since the last
# call (nstat's own history), one line. Loopback loses a segment only at a
# full receive queue, and the loss costs its connection for good (a lower
# ssthresh), so each run's counts say which host's job caused one.
tcp_counters() {
    command -v nstat >/dev/null 2>&1 || return 0
    nstat 2>/dev/null | grep -E 'TcpRetransSegs|RcvQDrop|BacklogDrop|Prune|OFODrop|RcvCollapsed|TCPLossProbes|TCPSackRecovery|TCPLostRetransmit|TCPTimeouts' |
        awk '{ printf "%s=%s ", $1, $2 }'
}

# --- the rounds ------------------------------------------------------------
log "guest kernel command line: $(cat /proc/cmdline)"
log "rounds: $ROUNDS; matrix ${SECS}s + 2s warm-up per job; tenants ${TSECS}s + ${TRAMP}s, sim device at ${SCALE}x"
# All matrix rounds first, then all tenant rounds: the sim target keeps
# working off what the QD 128 writer left (its model's garbage
# collection) after the tenants' fio ends, and the matrix job right after
# a tenants run measured that (at 80790cb the first run of round 3, the
# default volume at 4k randread QD 32, ran 0.63x its credits-off run,
# against 1.06x in round 1). For the same reason the tenants' two modes
# alternate their order by round.
round=1
while [ $round -le "$ROUNDS" ] && { [ -z "$ONLY" ] || [ "$ONLY" = matrix ]; }; do
    matrix_job $round 4k-randread-qd32 randread 4k 32
    matrix_job $round 4k-randwrite-qd32 randwrite 4k 32
    matrix_job $round 128k-read-qd32 read 128k 32
    matrix_job $round 128k-write-qd32 write 128k 32
    matrix_job $round 1m-read-qd32 read 1m 32
    matrix_job $round 4k-randread-qd1 randread 4k 1
    matrix_job $round 4k-randread-qd128 randread 4k 128
    matrix_job $round 4k-randread-2jobs-qd32 randread 4k 32 2
    placement "after round $round"
    sockets "after round $round"
    round=$((round + 1))
done
# tenant_rounds READER_DEV WRITER_DEV CASE: every round of a tenant case,
# default then off in odd rounds, off then default in even ones.
tenant_rounds() {
    _tr=1
    while [ $_tr -le "$ROUNDS" ]; do
        if [ $((_tr % 2)) -eq 1 ]; then
            tenants $_tr default "$1" "$2" "$3"
            tenants $_tr off "$1" "$2" "$3"
        else
            tenants $_tr off "$1" "$2" "$3"
            tenants $_tr default "$1" "$2" "$3"
        fi
        _tr=$((_tr + 1))
    done
}
if [ -z "$ONLY" ] || [ "$ONLY" = tenants ]; then
    tenant_rounds "$R_DEV" "$W_DEV" two-tenants
fi
# A volume beside a second client: the reader is the kernel's NVMe/TCP
# host on the same sim namespace, which no gate of ours sees (the
# neighbours view covers this host's volumes only, and volume `reader`
# idles), so only the writer's own estimate and gain probe protect it:
# Flint's case of a tenant on another host, without a controller. The
# same rounds, writer default against off.
if [ -z "$ONLY" ] || [ "$ONLY" = tenants ]; then
    if check "kernel host connects to the sim namespace" nvme connect -t tcp -a 127.0.0.1 -s 4421 -n $SIM_NQN &&
        wait_for "the kernel host's sim namespace appears" 20 nvme_ns_dev $SIM_NQN 1; then
        KSIM=$(nvme_ns_dev $SIM_NQN 1)
        log "second client: the kernel host's $KSIM reads beside the writer's $W_DEV"
        tenant_rounds "$KSIM" "$W_DEV" second-client
        check "the kernel host leaves the sim namespace" nvme disconnect -n $SIM_NQN
    fi
fi
if [ -z "$ONLY" ] || [ "$ONLY" = tenants ]; then
    log "the writer's gain probes over the tenant rounds (last 80):"
    grep -a 'probe \(up\|down\) from gain' "${UBLK_NVMF_RUN_DIR:-/run/ublk-nvmf}/writer.log" 2>/dev/null |
        tail -n 80 | sed 's/^/    writer | /'
fi

# --- part 3: profiles --------------------------------------------------------
# thread_times: per thread "tid comm run_ns runqueue_ns slices" from
# /proc/*/task/*/schedstat (threads named by their process's comm).
thread_times() {
    for _t in /proc/[0-9]*/task/[0-9]*; do
        # (A thread may exit between the glob and the reads: the
        # redirection's error is the shell's, so it is silenced around.)
        { read -r _run _wait _sl <"$_t/schedstat"; } 2>/dev/null || continue
        { read -r _comm <"$_t/comm"; } 2>/dev/null || continue
        echo "${_t##*/} ${_comm// /_} $_run $_wait $_sl"
    done
    echo "uptime_ms - $(uptime_ms) 0 0"
}
# perf_error N: the first N lines of perf stat's output (its log) on one
# line: the error comes before the usage text (its option lines, `  -x`).
perf_error() { grep -v '^ *-' /tmp/perf-stat.log | head -n "$1" | tr '\n' ' '; }

# profile HOST JOB DEV RW BS: perf over BENCH_SECS of the job, after 2 s.
profile() {
    fio --name=p --filename="$3" --ioengine=libaio --direct=1 --rw="$4" --bs="$5" \
        --iodepth=32 --runtime=$((SECS + 6)) --time_based --size=64M --randrepeat=0 \
        --norandommap --output-format=terse --terse-version=3 >/tmp/prof-fio.out 2>&1 &
    _fp=$!
    sleep 2
    # Beside the samples, over the same seconds: every process's system
    # calls and context switches (exact counts, not samples), to tell
    # per request what the target and the client do with each host.
    # Our volume's socket counters over the same window (ublk hosts only).
    _sock0=""
    case "$1" in ublk*) _sock0=$(socket_counts ublka) ;; esac
    # Clock reads that are system calls (see the clocksource line) are
    # counted apart where the kernel has the tracepoint.
    _ev=raw_syscalls:sys_enter
    perf stat -e syscalls:sys_enter_clock_gettime true >/dev/null 2>&1 &&
        _ev=$_ev,syscalls:sys_enter_clock_gettime
    # `-a --per-thread` maps every thread in /proc before it counts, and
    # the first host's map failed in every profile run of 2026-12-01
    # ("failed to parse CPUs map: No such file or directory", exit 234)
    # while the helpers below forked and exited; the next host's did not.
    # So nothing else here forks until the counters are open, and a start
    # that failed is retried. perf starts its workload only once its
    # counters are open, so the workload's first act says so through a
    # FIFO; the wait for it is a shell builtin (no process comes or goes
    # meanwhile), and a perf that dies first says so through the same FIFO.
    rm -f /tmp/perf-go && mkfifo /tmp/perf-go
    exec 9<>/tmp/perf-go
    _try=0
    while :; do
        ( perf stat -a --per-thread -e "$_ev" -x, -o /tmp/perf-stat.txt -- \
              sh -c "echo go >/tmp/perf-go; exec sleep $SECS" >/tmp/perf-stat.log 2>&1
          _rc=$?
          echo "exit $_rc" >/tmp/perf-go
          exit $_rc ) &
        _psp=$!
        _go=""
        read -t 60 -r _go <&9
        [ "$_go" = go ] && break
        wait $_psp
        _try=$((_try + 1))
        log "profile $1 $2: perf stat did not start (try $_try, $_go): $(perf_error 2)"
        [ $_try -lt 3 ] || break
    done
    tcp_counts >/tmp/tcp0.txt
    # TCP's view of the client's connections mid-window (console log):
    # receive buffer (skmem rb), what is queued unread (r), the receive
    # window's autotuning (rcv_space, rcv_ssthresh), per connection.
    ( sleep $((SECS / 2)); ss -tinmO state established '( dport = :4420 )' 2>&1 | head -n 200 ) >/tmp/ss-mid.txt &
    _ssp=$!
    # Read data waiting unread in the client's sockets (all connections to
    # the target, /proc/net/tcp's rx_queue), sampled every 0.1 s over the
    # window: data that waits while the guest idles waits on a wakeup.
    ( _end=$(($(uptime_ms) + SECS * 1000))
      while [ "$(uptime_ms)" -lt "$_end" ]; do
          awk 'function hex(h, i, n) { n = 0; h = tolower(h); for (i = 1; i <= length(h); i++) n = n * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1; return n }
               $3 ~ /:1144$/ && $4 == "01" { split($5, q, ":"); t += hex(q[2]) } END { print t + 0 }' /proc/net/tcp
          sleep 0.1
      done ) >/tmp/unread.txt &
    _urp=$!
    thread_times >/tmp/threads0.txt
    perf record -a -g -e cpu-clock -F 499 -o /tmp/perf.data -- sleep "$SECS" >/tmp/perf-rec.log 2>&1
    _prc=$?
    thread_times >/tmp/threads1.txt
    tcp_counts >/tmp/tcp1.txt
    _sock1=""
    [ -n "$_sock0" ] && _sock1=$(socket_counts ublka)
    wait $_psp
    _psrc=$?
    exec 9<&-
    wait $_ssp
    wait $_urp
    # Where the client's threads block (console log): the kernel stacks
    # they switch out on, over 2 s after the window while fio still runs.
    # The guest idles through large jobs while read data waits unread in
    # our socket, so what the queue thread waits on is the question.
    [ -n "${BENCH_SWITCHES:-}" ] &&
        perf record -a -g -e sched:sched_switch -o /tmp/switch.data -- sleep 2 >/tmp/perf-switch.log 2>&1 &&
        perf report -i /tmp/switch.data --no-children --sort comm,sym -g caller,2,callee,function,count --stdio \
            --percent-limit 3 2>/dev/null | awk '/^ +[0-9.]+%/ { show = ($2 == "ublk-nvmf" || $2 ~ /^kworker/ || $2 == "fio") } show && !/^$/' |
            head -n 200 >/tmp/switch.txt
    sort -n /tmp/unread.txt | awk -v h="$1" -v j="$2" '{ v[NR] = $1; if ($1 >= 262144) big++; if ($1 > 0) some++ }
        END { if (NR) printf "BENCH profile host=%s job=%s by=unread samples=%d nonzero=%.2f over_256k=%.2f median=%d p90=%d max=%d\n",
            h, j, NR, some / NR, big / NR, v[int((NR + 1) / 2)], v[int(NR * 0.9) > 0 ? int(NR * 0.9) : 1], v[NR] }' | tee -a "$FIO_BENCH_OUT"
    echo "---- profile $1 $2: sockets mid-window ----"
    cat /tmp/ss-mid.txt
    if [ -n "${BENCH_SWITCHES:-}" ]; then
        echo "---- profile $1 $2: where threads block (sched_switch stacks) ----"
        cat /tmp/switch.txt 2>/dev/null || tail -n 3 /tmp/perf-switch.log
    fi
    wait $_fp
    if [ $_prc -ne 0 ] || ! grep -q '^3;' /tmp/prof-fio.out; then
        fail "profile $1 $2 (perf exit $_prc)"
        tail -n 5 /tmp/perf-rec.log /tmp/prof-fio.out | sed 's/^/    | /'
        return 1
    fi
    pass "profile $1 $2"
    for _by in comm comm,dso sym target-sym client-sym; do
        _sort=$_by _only=""
        # The target's own symbols: what it spends with this host; and
        # ours (the volumes' processes, user and kernel time).
        [ "$_by" = target-sym ] && _sort=sym _only="--comms gimbal-target --percentage absolute"
        [ "$_by" = client-sym ] && _sort=comm,sym
        # ublk-nvmf's time is spread thin: its symbols down to 0.2 %.
        _lim=1
        [ "$_by" = client-sym ] && _lim=0.2
        perf report -i /tmp/perf.data --no-children --sort "$_sort" $_only -g none --stdio --percent-limit $_lim 2>/dev/null |
            grep -E '^ +[0-9.]+%' | { [ "$_by" = client-sym ] && awk '$2 == "ublk-nvmf" { $2 = "" } $2 == ""' || cat; } | head -n 40 |
            awk -v h="$1" -v j="$2" -v by="$_by" '{ sh = $1; $1 = ""; sub(/^ +/, ""); gsub(/ /, "_");
                printf "BENCH profile host=%s job=%s by=%s share=%s name=%s\n", h, j, by, sh, $0 }' |
            tee -a "$FIO_BENCH_OUT"
    done
    # Per request: the counts over the window divided by fio's I/Os in it
    # (its IOPS, reads or writes, times the window). Thread names are
    # summed per process name (`comm-tid` in perf's output).
    _iops=$(awk -F';' '/^3;/ { print $8 + $49 }' /tmp/prof-fio.out)
    # Each busy thread's time on a CPU and waiting for one over the window,
    # from the scheduler's own clock (schedstat: exact, where the samples
    # above come from a timer that a TCG guest may deliver late).
    # (The window is timed by the dumps' own uptimes: on this guest a
    # dump of every thread takes a while.)
    _tw=$(awk '$1 == "uptime_ms" { t[FILENAME] = $3 } END { for (f in t) if (f ~ /1/) b = t[f]; else a = t[f]; print (b - a) / 1000 }' /tmp/threads0.txt /tmp/threads1.txt)
    awk -v h="$1" -v j="$2" -v secs="$_tw" -v iops="$_iops" '
        NR == FNR { r0[$1] = $3; w0[$1] = $4; s0[$1] = $5; next }
        $1 != "uptime_ms" && ($1 in r0) && ($3 - r0[$1]) >= secs * 1e7 {
            printf "BENCH profile host=%s job=%s by=thread comm=%s on_cpu=%.3f runqueue=%.3f slices_per_sec=%.0f slices_per_io=%.2f cpu_us_per_io=%.0f\n",
                h, j, $2, ($3 - r0[$1]) / secs / 1e9, ($4 - w0[$1]) / secs / 1e9, ($5 - s0[$1]) / secs,
                (iops > 0) ? ($5 - s0[$1]) / secs / iops : 0,
                (iops > 0) ? ($3 - r0[$1]) / 1e3 / secs / iops : 0 }' \
        /tmp/threads0.txt /tmp/threads1.txt | sort -t= -k6 -n -r | tee -a "$FIO_BENCH_OUT"
    if [ $_psrc -eq 0 ]; then
        awk -F, -v h="$1" -v j="$2" -v secs="$SECS" -v iops="$_iops" '
            NF >= 4 && $2 ~ /^[0-9]+$/ { c = $1; sub(/-[0-9]+$/, "", c); gsub(/ /, "", c); n[c "," $4] += $2 }
            END { for (k in n) { split(k, a, ","); if (n[k] >= secs * 10)
                printf "BENCH profile host=%s job=%s by=events comm=%s event=%s per_sec=%.0f per_io=%.2f\n",
                    h, j, a[1], a[2], n[k] / secs, (iops > 0) ? n[k] / secs / iops : 0 } }' \
            /tmp/perf-stat.txt | sort | tee -a "$FIO_BENCH_OUT"
    else
        log "profile $1 $2: perf stat failed (exit $_psrc): $(perf_error 4)"
    fi
    # Socket sends and receives per request (a receive is a ring round
    # trip: how many a large read's data takes is what direct receives
    # cost), from the volume's status over the window.
    if [ -n "$_sock1" ]; then
        printf '%s %s\n' "$_sock0" "$_sock1" | awk -v h="$1" -v j="$2" -v secs="$SECS" -v iops="$_iops" '
            NF == 8 && iops > 0 { n = secs * iops
                printf "BENCH profile host=%s job=%s by=socket sends_per_io=%.2f receives_per_io=%.2f direct_per_io=%.2f waited_per_io=%.2f\n",
                    h, j, ($5 - $1) / n, ($6 - $2) / n, ($7 - $3) / n, ($8 - $4) / n }' | tee -a "$FIO_BENCH_OUT"
    fi
    # What TCP did per request over the window (every counter that moved
    # at least once a second): delayed and quick ACKs, zero windows and
    # window probes, retransmits, collapsed or pruned receive queues. The
    # guest idles through most of a large job on either host (the
    # profile's swapper share), so its requests wait on something other
    # than a CPU, and a TCP timer is one candidate (issue 14).
    awk -v h="$1" -v j="$2" -v secs="$SECS" -v iops="$_iops" '
        NR == FNR { v0[$1] = $2; next }
        ($1 in v0) && $2 - v0[$1] >= secs && iops > 0 {
            printf "BENCH profile host=%s job=%s by=tcp counter=%s per_sec=%.0f per_io=%.3f\n",
                h, j, $1, ($2 - v0[$1]) / secs, ($2 - v0[$1]) / secs / iops }' \
        /tmp/tcp0.txt /tmp/tcp1.txt | tee -a "$FIO_BENCH_OUT"
    # Who calls the copies (console log only): the call chains of the
    # kernel's copy and page-clearing routines and of unresolved user code
    # (libc's memcpy/memset variants have no symbols in the guest).
    echo "---- profile $1 $2: callers of copies ----"
    perf report -i /tmp/perf.data --no-children --sort sym -g caller,2,callee --stdio \
        --percent-limit 2 2>/dev/null | awk '/^ +[0-9.]+%/ { show = ($0 ~ /copy|movs|clear_page|memcpy|memset|\[\.\] 0x/) } show' | head -n 160
    # Where the client's own processes spend (console log): their symbols
    # above 1 % of all samples with their callers.
    echo "---- profile $1 $2: ublk-nvmf's symbols and callers ----"
    perf report -i /tmp/perf.data --no-children --sort comm,sym -g caller,1,callee --stdio \
        --percent-limit 1 2>/dev/null | awk '/^ +[0-9.]+%/ { show = ($2 == "ublk-nvmf") } show && !/^$/' | head -n 250
}
if [ -n "${BENCH_PERF:-}" ] && { [ -z "$ONLY" ] || [ "$ONLY" = profile ]; }; then
    require_cmd perf || exit 1
    for j in "128k-read-qd32 read 128k" "128k-write-qd32 write 128k" "4k-randread-qd32 randread 4k" "1m-read-qd32 read 1m"; do
        set -- $j
        case ",${BENCH_JOBS:-$1}," in *",$1,"*) ;; *) continue ;; esac
        set_mode ublka off || exit 1
        profile ublk-credits-off "$1" "$D_A" "$2" "$3"
        # BENCH_FIXED=1: the write also sent from the request's pages.
        if [ -n "${BENCH_FIXED:-}" ] && [ "$2" = write ]; then
            set_mode ublka fixed-off || exit 1
            profile ublk-fixed-off "$1" "$D_A" "$2" "$3"
        fi
        # BENCH_HEADS=1: the write also with its headers sent apart.
        if [ -n "${BENCH_HEADS:-}" ] && [ "$2" = write ]; then
            set_mode ublka heads-off || exit 1
            profile ublk-noheads-off "$1" "$D_A" "$2" "$3"
        fi
        # BENCH_WAIT=SIZE: the read also with read_wait_min=SIZE.
        if [ -n "${BENCH_WAIT:-}" ] && [ "$2" = read ]; then
            set_mode ublka wait-off || exit 1
            profile ublk-wait-off "$1" "$D_A" "$2" "$3"
        fi
        profile kernel "$1" "$KDEV" "$2" "$3"
    done
fi

# --- part 4: both credit modes interleaved in one fio run --------------------
# BENCH_ONLY=interleave (with part 1's setup). Goal 1 asks the default for
# 0.97x of credits off, and part 1's ratios cannot resolve 3 %: one run
# against the next on this host differs by up to 30 % (the A/A ratios),
# and three rounds do not average that away. Here one fio run per job and
# volume lasts BENCH_SEGMENTS (8) segments of BENCH_SEGMENT_SECS (8) s,
# and `ublk-nvmf set` switches the volume between the default and credits
# off at every segment's start (volume a starts with the default, b with
# off), so the modes meet the host's drift within seconds of each other.
# fio logs IOPS per second; a segment's rate is the mean of the seconds
# that lie whole between 1 s after its switch and 1 s before the next (the
# estimate keeps learning while off, so a default segment starts with the
# state the path gave it, as after any change of load; fio's own start
# lags the switch clock by under a second). Reported per job and volume
# ("BENCH interleave" lines): every segment's rate, the default's mean
# over off's, and for each inner segment its rate against its two
# neighbours (A-B-A, as the gain probe measures: a drift cancels), their
# median and spread; then per job the median over both volumes' A-B-A
# ratios. With it, the gate's holds in the same run (gate_line, mode
# "interleaved": only default segments hold). BENCH_AA=1 is the control:
# the same runs and labels, but every segment is set to credits off, so
# its "default over off" ratios show what the measurement gives when the
# two modes are the same.
ISEG=${BENCH_SEGMENT_SECS:-8}
ISEGS=${BENCH_SEGMENTS:-8}

# interleave JOB VOLUME DEV RW BS QD FIRST_MODE
interleave() {
    _j=$1 _v=$2 _d=$3 _m=$7
    case ",${BENCH_JOBS:-$_j}," in *",$_j,"*) ;; *) return 0 ;; esac
    rm -f /tmp/il_iops.*.log
    # set_mode's mode: the label's, or off for every segment under BENCH_AA.
    _sm() { if [ -n "${BENCH_AA:-}" ]; then echo off; else echo "$1"; fi; }
    set_mode "$_v" "$(_sm "$_m")" || return 1
    _g0=$(gate_counts "$_v")
    _t0=$(uptime_ms)
    echo "0 $_m" >/tmp/il-switch.txt
    fio --name=il --filename="$_d" --ioengine=libaio --direct=1 --rw="$4" --bs="$5" \
        --iodepth="$6" --runtime=$((ISEG * ISEGS)) --time_based --size=512M \
        --randrepeat=0 --norandommap --write_iops_log=/tmp/il --log_avg_msec=1000 \
        --output-format=terse --terse-version=3 >/tmp/il.out 2>&1 &
    _fp=$!
    _k=1
    while [ $_k -lt "$ISEGS" ]; do
        _wait=$((_t0 + _k * ISEG * 1000 - $(uptime_ms)))
        [ $_wait -gt 0 ] && sleep "$(awk -v w=$_wait 'BEGIN { printf "%.3f", w / 1000 }')"
        if [ "$_m" = auto ]; then _next=off; else _next=auto; fi
        # On a failed switch (set_mode counts the failure) the segment
        # keeps the mode in force and is recorded so.
        set_mode "$_v" "$(_sm "$_next")" && _m=$_next
        echo "$(($(uptime_ms) - _t0)) $_m" >>/tmp/il-switch.txt
        _k=$((_k + 1))
    done
    wait $_fp
    _rc=$?
    if [ $_rc -ne 0 ] || ! grep -q '^3;' /tmp/il.out || ! [ -s /tmp/il_iops.1.log ]; then
        fail "interleaved $_j on $_v (fio exit $_rc)"
        tail -n 5 /tmp/il.out | sed 's/^/    | /'
        return 1
    fi
    pass "interleaved $_j on $_v"
    # The gate is in force in the default segments (none under BENCH_AA).
    gate_line interleaved "$_v" "$_j" interleaved "$_g0" "$(gate_counts "$_v")" "$6" \
        $(($(grep -c ' auto$' /tmp/il-switch.txt) * ISEG * 1000))
    # The switch times first (file 1), then fio's per-second log (file 2:
    # "ms, iops, direction, bs, offset").
    awk -F', *' -v j="$_j" -v vol="$_v" -v segs="$ISEGS" -v seg="$ISEG" "$AWK_STATS"'
        BEGIN { n = 0 }
        FNR == NR { split($0, a, " "); sw[n] = a[1] + 0; mode[n] = a[2]; n++; next }
        { if (!ended) { sw[n] = segs * seg * 1000; ended = 1 }
          t = $1 + 0; for (k = n - 1; k > 0 && sw[k] > t - 2000; k--) ;
          # The second (t-1000, t] must start 1 s after switch k and end
          # 1 s before the next (or fio'"'"'s end).
          if (t - 2000 >= sw[k] && t + 1000 <= sw[k + 1]) { sum[k] += $2; cnt[k]++ } }
        END {
            for (k = 0; k < n; k++) {
                r[k] = cnt[k] ? sum[k] / cnt[k] : 0
                printf "BENCH interleave job=%s vol=%s segment=%d mode=%s seconds=%d iops=%.0f\n", j, vol, k, mode[k], cnt[k], r[k]
                if (mode[k] == "auto") { sa += r[k]; na++ } else { so += r[k]; no++ }
            }
            m = 0
            for (k = 1; k < n - 1; k++) {
                if (!cnt[k] || !cnt[k - 1] || !cnt[k + 1]) continue
                side = (r[k - 1] + r[k + 1]) / 2
                if (side <= 0 || r[k] <= 0) continue
                v[++m] = (mode[k] == "auto") ? r[k] / side : side / r[k]
            }
            sort(v, m); med = median(v, m)
            list = ""; for (i = 1; i <= m; i++) list = list (i > 1 ? "," : "") sprintf("%.3f", v[i])
            printf "BENCH interleave job=%s vol=%s default_over_off=%.3f aba_median=%.3f aba_min=%.3f aba_max=%.3f aba_n=%d aba=%s\n",
                j, vol, (na && no && so > 0) ? (sa / na) / (so / no) : 0, med, v[1], v[m], m, list }' \
        /tmp/il-switch.txt /tmp/il_iops.1.log | tee -a "$FIO_BENCH_OUT"
}
if [ "$ONLY" = interleave ]; then
    for j in "4k-randread-qd1 randread 4k 1" "4k-randread-qd32 randread 4k 32" \
        "4k-randread-qd128 randread 4k 128" "128k-read-qd32 read 128k 32" \
        "128k-write-qd32 write 128k 32"; do
        set -- $j
        interleave "$1" ublka "$D_A" "$2" "$3" "$4" auto
        interleave "$1" ublkb "$D_B" "$2" "$3" "$4" off
    done
    # Per job, both volumes' A-B-A ratios together.
    grep '^BENCH interleave job=.* aba=' "$FIO_BENCH_OUT" | awk "$AWK_STATS"'
        { for (i = 3; i <= NF; i++) { split($i, a, "="); f[a[1]] = a[2] }
          j = f["job"]; if (!(j in seen)) { seen[j] = 1; c[j] = 0; jobs[++nj] = j }
          k = split(f["aba"], xs, ","); for (i = 1; i <= k; i++) if (xs[i] != "") vals[j, ++c[j]] = xs[i] + 0 }
        END { for (y = 1; y <= nj; y++) { j = jobs[y]; m = c[j]
            if (m == 0) { printf "BENCH interleave summary job=%s aba_n=0\n", j; continue }
            for (i = 1; i <= m; i++) v[i] = vals[j, i]
            sort(v, m); med = median(v, m)
            printf "BENCH interleave summary job=%s aba_median=%.3f aba_min=%.3f aba_max=%.3f aba_n=%d goal=>=0.97 met=%s\n",
                j, med, v[1], v[m], m, (med >= 0.97) ? "yes" : "no" } }' | tee -a "$FIO_BENCH_OUT"
fi

# --- part 5: how fast a young volume's estimate opens (BENCH_ONLY=climb) ----
# The gain starts at `estimate_gain` (2) and climbs by probes, so a large-
# I/O job early in a volume's life is held to a small window (the 128k
# read runs of docs/benchmarks.md, "What the gate holds"). Here the fresh
# volume ublka, at the default, runs one fio job (BENCH_CLIMB_JOB: rw,bs,
# qd; default read,128k,32) for BENCH_CLIMB_SECS (60) s, and every 2 s a
# "BENCH climb" line gives the time since fio started, the window, the
# gain, the share of fio's requests the gate held in those 2 s (its
# wait total over requests x 2 s, as in gate_line), and the gain probe's
# decisions so far (up and down probes kept/measured, cruises undecided,
# whether it is still young), and the two halves of the bandwidth-delay
# product behind the window (bandwidth, base latency). BENCH_CLIMB_EVERY
# (2) sets the seconds between lines. Compare a change of
# the gain's start or climb by the seconds to a share near 0.
# BENCH_CLIMB_BEFORE (rw,bs,qd,secs) runs a job on the volume first.
if [ "$ONLY" = climb ]; then
    set_mode ublka auto || exit 1
    # BENCH_CLIMB_BEFORE=rw,bs,qd,secs: a job on the same volume first, at
    # the default, as the matrix runs 4 KiB jobs before a volume's first
    # large ones (the gate is then no longer fresh).
    if [ -n "${BENCH_CLIMB_BEFORE:-}" ]; then
        _b=$BENCH_CLIMB_BEFORE
        _brw=${_b%%,*} _b=${_b#*,}
        _bbs=${_b%%,*} _b=${_b#*,}
        _bqd=${_b%%,*} _bsecs=${_b#*,}
        fio_bench "climb before: $_brw $_bbs QD $_bqd" "$D_A" "$_brw" "$_bbs" "$_bqd" "$_bsecs"
        log "climb: ublka before the climb: $(ublk-nvmf status ublka 2>&1 | grep -m1 'qos: credits' | sed 's/^ *//')"
    fi
    # (after fio_bench, which sets the same shell variables)
    _spec=${BENCH_CLIMB_JOB:-read,128k,32}
    _rw=${_spec%%,*} _spec=${_spec#*,}
    _bs=${_spec%%,*} _qd=${_spec#*,}
    _secs=${BENCH_CLIMB_SECS:-60}
    fio --name=climb --filename="$D_A" --ioengine=libaio --direct=1 --rw="$_rw" --bs="$_bs" \
        --iodepth="$_qd" --runtime="$_secs" --time_based --size=512M --randrepeat=0 \
        --norandommap --output-format=terse --terse-version=3 >/tmp/climb.out 2>&1 &
    _fp=$!
    _t0=$(uptime_ms)
    _tp=$_t0
    _prev=$(gate_counts ublka)
    while kill -0 $_fp 2>/dev/null; do
        sleep "${BENCH_CLIMB_EVERY:-2}"
        _st=$(ublk-nvmf status ublka 2>/dev/null)
        _now=$(gate_counts ublka)
        _tn=$(uptime_ms)
        printf '%s %s\n' "$_prev" "$_now" | awk -v t=$((_tn - _t0)) -v dt=$((_tn - _tp)) -v n="$_qd" \
            -v w="$(echo "$_st" | sed -n 's/.*(window \([0-9]*\) from.*/\1/p' | head -n 1)" \
            -v g="$(echo "$_st" | sed -n 's/.* base, gain \([0-9.]*\),.*/\1/p' | head -n 1)" \
            -v bb="$(echo "$_st" | sed -n 's/.*from estimate: \([0-9.]*\) MiB\/s x \([0-9]*\) us base,.*/bw_mibps=\1 base_us=\2/p' | head -n 1)" \
            -v pr="$(echo "$_st" | sed -n 's/.* probes kept up \([0-9]*\/[0-9]*\) down \([0-9]*\/[0-9]*\), \([0-9]*\) undecided\(, young\)\{0,1\},.*/probes_up=\1 probes_down=\2 undecided=\3 young=\4/p' | head -n 1)" '
            NF == 6 && dt > 0 { sub(/young=, young/, "young=yes", pr); sub(/young=$/, "young=no", pr)
                printf "BENCH climb t_ms=%d window=%s gain=%s admitted=%d held=%d gate_share=%.3f %s %s\n",
                t, w, (g == "") ? "-" : g, $4 - $1, $5 - $2, ($6 - $3) / (n * dt * 1000), pr, bb }' | tee -a "$FIO_BENCH_OUT"
        _prev=$_now _tp=$_tn
    done
    wait $_fp
    if grep -q '^3;' /tmp/climb.out; then pass "climb: $_rw $_bs QD $_qd for ${_secs}s"; else fail "climb: fio failed"; fi
fi

# --- part 6: what a volume's offset belongs to (BENCH_ONLY=offset) ---------
# Two volumes with the same config have differed by a persistent 10-25 %
# ("Measuring the measure", docs/benchmarks.md): the default/off ratios
# cancel it by running both modes on each volume, but the ublk/kernel
# ratios only halve it, and a user gets a slower volume by chance. Which
# state carries it is not known (on fresh volumes this part found none;
# the matrix still shows one at times: docs/benchmarks.md, 2026-11-29,
# fifth). Here ublka stays as it is the whole run while ublkb is renewed
# in one of three ways between draws, in turn:
#   none     nothing changes (the control: how far two draws of the same
#            volume differ)
#   recover  its server is killed (-9) and `ublk-nvmf recover` reattaches
#            the same /dev/ublkbN: a new process, new threads, buffers,
#            io_uring and connection, the same ublk device and blk-mq
#            queues
#   readd    `del` and `add`: a new device too
# Each draw runs BENCH_OFFSET_PAIRS (4) pairs of fio runs (BENCH_SECS
# after 2 s of warm-up) of BENCH_OFFSET_JOB (rw,bs,qd; default
# write,128k,32: the job whose offset kept its sign through five rounds)
# on a and b, credits off, the order alternating; the draw's offset is
# the geometric mean of its pairs' b/a. Reported: every pair ("BENCH
# offset pair"), every draw ("BENCH offset draw ... b_over_a"), and per
# action the median and spread of how far b/a moved from the draw
# before, as a factor >= 1 ("BENCH offset summary"): if the offset
# belongs to what an action renews, that action's changes stand out from
# the control's.
# BENCH_OFFSET_DRAWS (12) draws.
offset_draw() {
    _d=$1 _act=$2
    _spec=${BENCH_OFFSET_JOB:-write,128k,32}
    _rw=${_spec%%,*} _spec=${_spec#*,}
    _bs=${_spec%%,*} _qd=${_spec#*,}
    set_mode ublka off || return 1
    set_mode ublkb off || return 1
    _p=1
    while [ $_p -le "${BENCH_OFFSET_PAIRS:-4}" ]; do
        if [ $((_p % 2)) -eq 1 ]; then _order="a b"; else _order="b a"; fi
        for _x in $_order; do
            if [ $_x = a ]; then _dev=$D_A; else _dev=$D_B; fi
            fio_bench "offset draw=$_d action=$_act pair=$_p vol=$_x" "$_dev" "$_rw" "$_bs" "$_qd" "$SECS" >/dev/null
        done
        _p=$((_p + 1))
    done
    awk -v d="$_d" -v act="$_act" "$AWK_STATS"'
        $1 == "BENCH" && $2 == "offset" && kv("draw") == d && kv("vol") != "" {
            if (kv("vol") == "a") a[kv("pair")] = kv("iops"); else b[kv("pair")] = kv("iops") }
        END { n = 0; prod = 1; lo = 0; hi = 0
            for (k in a) if (k in b && a[k] > 0) { q = b[k] / a[k]; n++; prod *= q
                if (lo == 0 || q < lo) lo = q; if (q > hi) hi = q
                printf "BENCH offset pair draw=%s action=%s pair=%s a_iops=%d b_iops=%d b_over_a=%.3f\n", d, act, k, a[k], b[k], q }
            # prod^(1/n) by bisection: busybox awk has no math functions.
            g = 1; if (n > 0) { x0 = 0.01; x1 = 100; for (i = 0; i < 100; i++) { m = (x0 + x1) / 2; t = 1; for (j = 0; j < n; j++) t *= m; if (t < prod) x0 = m; else x1 = m } g = (x0 + x1) / 2 }
            printf "BENCH offset draw=%s action=%s b_over_a=%.3f pairs=%d min=%.3f max=%.3f\n", d, act, g, n, lo, hi }' \
        "$FIO_BENCH_OUT" | tee -a "$FIO_BENCH_OUT"
}
if [ "$ONLY" = offset ]; then
    _draws=${BENCH_OFFSET_DRAWS:-12}
    _d=1 _act=first
    while [ $_d -le "$_draws" ]; do
        offset_draw $_d $_act || exit 1
        log "offset draw $_d: ublkb $(ublk-nvmf list | awk '$2=="ublkb"')"
        [ $_d -eq "$_draws" ] && break
        case $((_d % 3)) in
        1) _act=none ;;
        2)
            _act=recover
            _pid=$(ublk-nvmf list | awk '$2=="ublkb" && $3!="dead" {print $3}')
            kill -9 "$_pid"
            sleep 1
            check_output "offset: recover ublkb (draw $((_d + 1)))" "^$D_B\$" ublk-nvmf recover ublkb || exit 1
            ;;
        0)
            _act=readd
            check "offset: del ublkb (draw $((_d + 1)))" ublk-nvmf del ublkb || exit 1
            volume D_B ublkb 4420 $NQN 3 1 off || exit 1
            ;;
        esac
        _d=$((_d + 1))
    done
    # Per action, how far b/a moved from the draw before, as a factor >= 1
    # (exp |log change|; busybox awk has no log).
    grep '^BENCH offset draw=.* b_over_a=' "$FIO_BENCH_OUT" | awk "$AWK_STATS"'
        { d = kv("draw") + 0; act[d] = kv("action"); r[d] = kv("b_over_a") + 0; if (d > nd) nd = d }
        END { for (d = 2; d <= nd; d++) { if (r[d] <= 0 || r[d - 1] <= 0) continue
                q = r[d] / r[d - 1]; if (q < 1) q = 1 / q
                x = act[d]; c[x]++; v[x, c[x]] = q; acts[x] = 1 }
            for (x in acts) { m = c[x]; for (i = 1; i <= m; i++) w[i] = v[x, i]
                sort(w, m)
                printf "BENCH offset summary action=%s changes=%d change_median=%.3f change_min=%.3f change_max=%.3f\n",
                    x, m, median(w, m), w[1], w[m] } }' | tee -a "$FIO_BENCH_OUT"
fi

# --- part 7: ublk against the kernel host, interleaved (BENCH_ONLY=versus) --
# Goals 2 and 3 compare our host with the kernel host, and part 1 takes
# that ratio from runs up to a minute apart, on a host whose speed moves
# by 10-30 % between such runs (its A/A ratios): a job's ublk/kernel has
# read 0.82 in one run and 1.12 in another with the same code
# (docs/benchmarks.md, 2026-12-01). Here short fio runs alternate between
# our host and the kernel host, BENCH_VS_SEGMENTS (16) of them per job,
# each BENCH_SEGMENT_SECS (8) s after fio's 2 s warm-up: ublk on volume a,
# kernel, ublk on volume b, kernel, ... (the two volumes take turns, so
# an offset of one volume halves instead of entering whole), all volumes
# in BENCH_VS_MODE (auto: the default; or off). For each inner segment,
# its rate against the mean of its two neighbours (A-B-A, with our host
# as the numerator both ways), so a drift slower than a segment cancels.
# Reported per job: every segment ("BENCH versus segment"), the A-B-A
# ratios and their median and spread ("BENCH versus summary", with the
# issue's goal: a report, not a check). The jobs: 128k read and write, 1M
# read, 4k randwrite (QD 32) and the two-job case on the queues = 2
# volumes; BENCH_JOBS selects. BENCH_VS_Q2=1 runs every job on the
# queues = 2 volumes (the kernel host has an I/O queue per vCPU, two
# here, and a single fio job's requests leave on its CPU's queue).
versus() {
    _j=$1 _rw=$2 _bs=$3 _qd=$4 _n=$5 _goal=$6
    case ",${BENCH_JOBS:-$_j}," in *",$_j,"*) ;; *) return 0 ;; esac
    if [ "$_n" -gt 1 ] || [ -n "${BENCH_VS_Q2:-}" ]; then _va=ublkq2a _vb=ublkq2b _a=$D_A2 _b=$D_B2; else _va=ublka _vb=ublkb _a=$D_A _b=$D_B; fi
    set_mode "$_va" "${BENCH_VS_MODE:-auto}" || return 1
    set_mode "$_vb" "${BENCH_VS_MODE:-auto}" || return 1
    _k=0
    while [ $_k -lt "${BENCH_VS_SEGMENTS:-16}" ]; do
        case $((_k % 4)) in
        0) _h=ublk-a _d=$_a ;;
        2) _h=ublk-b _d=$_b ;;
        *) _h=kernel _d=$KDEV ;;
        esac
        fio_bench "versus segment=$_k host=$_h job=$_j" "$_d" "$_rw" "$_bs" "$_qd" "$ISEG" "$_n" || return 1
        _k=$((_k + 1))
    done
    awk -v j="$_j" -v goal="$_goal" "$AWK_STATS"'
        $1 == "BENCH" && $2 == "versus" && kv("job") == j && kv("segment") != "" {
            k = kv("segment") + 0; r[k] = kv("mibps") + 0; h[k] = kv("host"); if (k + 1 > n) n = k + 1 }
        END {
            for (k = 1; k < n - 1; k++) {
                side = (r[k - 1] + r[k + 1]) / 2
                if (side <= 0 || r[k] <= 0) continue
                x = (h[k] == "kernel") ? side / r[k] : r[k] / side
                v[++m] = x; list = list (m > 1 ? "," : "") sprintf("%.3f", x)
                if (h[k] == "kernel") { nk++; sk += x } else { nu++; su += x }
            }
            if (m == 0) { printf "BENCH versus summary job=%s aba_n=0\n", j; exit }
            sort(v, m); med = median(v, m)
            printf "BENCH versus summary job=%s mode=%s ublk_over_kernel_median=%.3f min=%.3f max=%.3f aba_n=%d mean_at_ublk=%.3f mean_at_kernel=%.3f goal=%s met=%s aba=%s\n",
                j, mode, med, v[1], v[m], m, nu ? su / nu : 0, nk ? sk / nk : 0, goal, (med >= substr(goal, 3) + 0) ? "yes" : "no", list }' \
        mode="${BENCH_VS_MODE:-auto}" "$FIO_BENCH_OUT" | tee -a "$FIO_BENCH_OUT"
}
if [ "$ONLY" = versus ]; then
    versus 128k-read-qd32 read 128k 32 1 ">=1.0"
    versus 128k-write-qd32 write 128k 32 1 ">=1.0"
    versus 1m-read-qd32 read 1M 32 1 ">=0.9"
    versus 4k-randwrite-qd32 randwrite 4k 32 1 ">=1.0"
    versus 4k-randread-2jobs-qd32 randread 4k 32 2 ">=1.0"
fi

# --- summary ---------------------------------------------------------------
# Goals of issue 14 (reported next to the medians, not checked).
goals="ublk/ublk-credits-off:4k-randread-qd1:>=0.97 ublk/ublk-credits-off:4k-randread-qd32:>=0.97
ublk/ublk-credits-off:4k-randread-qd128:>=0.97 ublk/ublk-credits-off:128k-read-qd32:>=0.97
ublk/ublk-credits-off:128k-write-qd32:>=0.97 ublk/kernel:128k-read-qd32:>=1.0
ublk/kernel:128k-write-qd32:>=1.0 ublk/kernel:1m-read-qd32:>=0.9 ublk/kernel:4k-randwrite-qd32:>=1.0
ublk/kernel:4k-randread-2jobs-qd32:>=1.0"
# The last three: the A/A ratio (how far the two volumes differ in the
# same mode) and default/off on each volume alone.
pairs="ublk/kernel ublk-credits-off/kernel ublk/ublk-credits-off"
[ -n "${BENCH_COPY:-}" ] && pairs="$pairs ublk-copy/kernel ublk-credits-off/ublk-copy"
[ -n "${BENCH_FIXED:-}" ] && pairs="$pairs ublk-fixed/kernel ublk/ublk-fixed ublk-a/ublk-fixed-a ublk-b/ublk-fixed-b"
[ -n "${BENCH_HEADS:-}" ] && pairs="$pairs ublk-noheads-off/kernel ublk-credits-off/ublk-noheads-off ublk-credits-off-a/ublk-noheads-off-a ublk-credits-off-b/ublk-noheads-off-b"
[ "${BENCH_Q2:-}" = both ] && pairs="$pairs ublk-q2-off/kernel ublk-q2-off/ublk-credits-off"
[ -n "${BENCH_WAIT:-}" ] && pairs="$pairs ublk-wait-off/kernel ublk-wait-off/ublk-credits-off ublk-wait-off-a/ublk-credits-off-a ublk-wait-off-b/ublk-credits-off-b"
pairs="$pairs ublk-credits-off-a/ublk-credits-off-b ublk-a/ublk-credits-off-a ublk-b/ublk-credits-off-b"
bench_ratios "$FIO_BENCH_OUT" host "$pairs" "$goals"
# The gate per job and mode, over all rounds and both volumes: the share of
# requests it held back and their mean wait (see gate_line).
grep '^BENCH gate round=' "$FIO_BENCH_OUT" | awk '
    { for (i = 3; i <= NF; i++) { split($i, a, "="); v[a[1]] = a[2] }
      k = v["job"] " " v["mode"]; if (!(k in n)) keys[++nk] = k
      n[k]++; ad[k] += v["admitted"]; hd[k] += v["held"]; t[k] += v["wait_us"]; rt[k] += v["requests"] * v["gated_ms"] * 1000
      if (v["bound"] != "" && (!(k in lo) || v["bound"] + 0 < lo[k])) lo[k] = v["bound"] + 0 }
    END { for (i = 1; i <= nk; i++) { k = keys[i]; split(k, b, " ")
        printf "BENCH gate summary job=%s mode=%s runs=%d admitted=%d held=%d held_pct=%.2f held_mean_us=%d gate_share=%.4f bound=%.3f worst_run_bound=%.3f\n",
            b[1], b[2], n[k], ad[k], hd[k], (ad[k] > 0) ? 100 * hd[k] / ad[k] : 0, (hd[k] > 0) ? t[k] / hd[k] : 0,
            (rt[k] > 0) ? t[k] / rt[k] : 0, (rt[k] > 0) ? 1 - t[k] / rt[k] : 1, lo[k] } }'
# The tenant cases (two-tenants, second-client): default over off, per
# round, then median and spread.
for c in two-tenants second-client; do
    grep '^BENCH round=[0-9]* tenants=' "$FIO_BENCH_OUT" | awk -v c="$c" "$AWK_STATS"'
    function summary(name, goal, n, v, med) {
        sort(v, n); med = median(v, n)
        printf "BENCH summary job=%s ratio=%s median=%.3f min=%.3f max=%.3f rounds=%d goal=%s met=%s\n",
            c, name, med, v[1], v[n], n, goal, (substr(goal, 1, 2) == "<=" ? (med <= substr(goal, 3) + 0) : (med >= substr(goal, 3) + 0)) ? "yes" : "no" }
    (kv("case") == "" ? "two-tenants" : kv("case")) == c {
      r = kv("round"); m = kv("tenants"); p[r, m] = kv("reader_p99_us"); t[r, m] = kv("total_kibps")
      if (!(r in seen)) { seen[r] = 1; rounds[++nr] = r } }
    END {
        n = 0
        for (k = 1; k <= nr; k++) {
            r = rounds[k]
            if (p[r, "off"] > 0 && t[r, "off"] > 0 && p[r, "default"] != "" && t[r, "default"] != "") {
                n++; a[n] = p[r, "default"] / p[r, "off"]; b[n] = t[r, "default"] / t[r, "off"]
                printf "BENCH round=%s job=%s ratio=reader_p99_default/off value=%.3f\n", r, c, a[n]
                printf "BENCH round=%s job=%s ratio=total_default/off value=%.3f\n", r, c, b[n]
            }
        }
        if (n > 0) { summary("reader_p99_default/off", "<=0.5", n, a); summary("total_default/off", ">=0.9", n, b) }
    }'
done

for v in $VOLUMES; do
    echo "---- ublk-nvmf status $v ----"
    ublk-nvmf status "$v"
done
if [ -n "$KDEV" ]; then check "disconnect the kernel host" nvme disconnect-all; fi
for v in $VOLUMES; do check "del $v" ublk-nvmf del "$v"; done
