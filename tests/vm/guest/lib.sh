# Shared helpers for guest scenarios: source it first (`. /vm/lib.sh`).
#
# Every check counts as passed or failed; the scenario's result line
# "N passed, N failed" is printed by `finish`, which also runs on exit so a
# scenario that stops early still reports. A scenario with no passed check,
# or one whose prerequisites are missing (require_*), fails: nothing passes
# silently.

PASS=0
FAIL=0
FINISHED=
LOGDIR=/tmp/vm-logs
mkdir -p "$LOGDIR"

log() { echo "[$(cut -d' ' -f1 /proc/uptime)] $*"; }
pass() { PASS=$((PASS + 1)); log "PASS: $*"; }
fail() { FAIL=$((FAIL + 1)); log "FAIL: $*"; }

# run_logged LOGNAME CMD...: runs CMD with output in $LOGDIR/LOGNAME.log,
# printed only when it fails, so the console shows what went wrong.
run_logged() {
    _name=$1
    shift
    "$@" >"$LOGDIR/$_name.log" 2>&1
    _rc=$?
    if [ $_rc -ne 0 ]; then
        log "command failed (exit $_rc): $*"
        tail -n 40 "$LOGDIR/$_name.log" | sed 's/^/    | /'
    fi
    return $_rc
}

_slug() { echo "$1" | tr -c 'a-zA-Z0-9_.-' '_' | cut -c1-60; }

# check DESCRIPTION CMD...: passes when CMD exits 0.
check() {
    _desc=$1
    shift
    if run_logged "$(_slug "$_desc")" "$@"; then pass "$_desc"; else fail "$_desc"; return 1; fi
}

# check_fails DESCRIPTION CMD...: passes when CMD exits non-zero.
check_fails() {
    _desc=$1
    shift
    if "$@" >"$LOGDIR/$(_slug "$_desc").log" 2>&1; then
        fail "$_desc (expected failure, got success)"
        return 1
    fi
    pass "$_desc"
}

# check_output DESCRIPTION PATTERN CMD...: passes when CMD exits 0 and its
# output matches the extended regular expression PATTERN.
check_output() {
    _desc=$1
    _pat=$2
    shift 2
    _log="$LOGDIR/$(_slug "$_desc").log"
    if "$@" >"$_log" 2>&1 && grep -Eq -- "$_pat" "$_log"; then
        pass "$_desc"
    else
        fail "$_desc (wanted /$_pat/)"
        tail -n 40 "$_log" | sed 's/^/    | /'
        return 1
    fi
}

# check_eq DESCRIPTION EXPECTED ACTUAL
check_eq() {
    if [ "$2" = "$3" ]; then pass "$1"; else fail "$1: expected '$2', got '$3'"; return 1; fi
}

# wait_for DESCRIPTION SECONDS CMD...: polls CMD every 0.2 s until it
# succeeds; fails the check at the deadline.
wait_for() {
    _desc=$1
    _secs=$2
    shift 2
    _tries=$((_secs * 5))
    while [ $_tries -gt 0 ]; do
        if "$@" >/dev/null 2>&1; then pass "$_desc"; return 0; fi
        sleep 0.2
        _tries=$((_tries - 1))
    done
    fail "$_desc (not within ${_secs}s)"
    return 1
}

# require_module MODULE...: loads each module; a module that will not load
# fails the scenario (it must never pass without the kernel feature).
require_module() {
    for _m in "$@"; do
        if ! modprobe "$_m" 2>"$LOGDIR/modprobe-$_m.log"; then
            fail "kernel module $_m cannot be loaded: $(cat "$LOGDIR/modprobe-$_m.log")"
            return 1
        fi
    done
}

# require_cmd CMD...: fails the scenario when a tool is not in the guest.
require_cmd() {
    for _c in "$@"; do
        if ! command -v "$_c" >/dev/null 2>&1; then
            fail "$_c is not in the guest image (is it built? see docs/testing.md)"
            return 1
        fi
    done
}

# start_daemon NAME CMD...: runs CMD in the background with its output in
# $LOGDIR/NAME.log; its pid is kept for stop_daemon and for the log dump.
start_daemon() {
    _n=$1
    shift
    "$@" >"$LOGDIR/daemon-$_n.log" 2>&1 &
    echo $! >"$LOGDIR/daemon-$_n.pid"
    log "started $_n (pid $!): $*"
}

# daemon_pid NAME
daemon_pid() { cat "$LOGDIR/daemon-$1.pid" 2>/dev/null; }

# daemon_alive NAME
daemon_alive() { _p=$(daemon_pid "$1") && [ -n "$_p" ] && kill -0 "$_p" 2>/dev/null; }

# stop_daemon NAME [SIGNAL]: signals the daemon (TERM by default), waits up
# to 10 s, then kills it.
stop_daemon() {
    _p=$(daemon_pid "$1") || return 0
    [ -n "$_p" ] || return 0
    kill "-${2:-TERM}" "$_p" 2>/dev/null
    _t=50
    while kill -0 "$_p" 2>/dev/null && [ $_t -gt 0 ]; do
        sleep 0.2
        _t=$((_t - 1))
    done
    kill -KILL "$_p" 2>/dev/null
    wait "$_p" 2>/dev/null
    rm -f "$LOGDIR/daemon-$1.pid"
    return 0
}

# finish [STATUS]: stops daemons, dumps their logs when anything failed,
# prints the result line and exits with the scenario's status. The EXIT trap
# passes the shell's exit status: a scenario that stops early (`... || exit
# 1`, a failing command under `set -e`) counts as failed even when every
# check it reached passed. A scenario calling `finish` itself passes nothing.
finish() {
    _status=${1:-0}
    [ -n "$FINISHED" ] && exit $FAIL
    FINISHED=1
    if [ "$_status" -ne 0 ] && [ $FAIL -eq 0 ]; then
        fail "scenario exited early (status $_status) after $PASS passed checks"
    fi
    for _pidf in "$LOGDIR"/daemon-*.pid; do
        [ -e "$_pidf" ] || continue
        _n=${_pidf##*/daemon-}
        stop_daemon "${_n%.pid}"
    done
    if [ $PASS -eq 0 ] && [ $FAIL -eq 0 ]; then
        fail "scenario ran no check"
    fi
    if [ $FAIL -ne 0 ]; then
        for _l in "$LOGDIR"/daemon-*.log; do
            [ -e "$_l" ] || continue
            echo "---- $_l (last 60 lines) ----"
            tail -n 60 "$_l"
        done
        echo "---- dmesg (last 40 lines) ----"
        dmesg | tail -n 40
    fi
    echo "$PASS passed, $FAIL failed"
    [ $FAIL -eq 0 ]
    exit $?
}
trap 'finish $?' EXIT

# Debian's busybox runs its own applet for a command name it knows, even
# when a real tool of that name is on PATH (prefer-applets). mke2fs and
# blkdiscard are applets, so call the real ones by path.
mkfs_ext4() { /usr/sbin/mke2fs -q -t ext4 -F "$@"; }
# -f: the scenarios discard on purpose, also over an old file system
# signature (blkdiscard refuses those otherwise).
blkdiscard_real() { /usr/sbin/blkdiscard -f "$@"; }

# is_mounted DIR
is_mounted() { grep -q " $1 " /proc/mounts; }

# fio_verify DESCRIPTION DEVICE RW BS IODEPTH SIZE [EXTRA...]: a fio run that
# writes with crc32c verification headers and verifies every block.
fio_verify() {
    _desc=$1 _dev=$2 _rw=$3 _bs=$4 _qd=$5 _size=$6
    shift 6
    check "$_desc" fio --name=verify --filename="$_dev" --ioengine=libaio --direct=1 \
        --rw="$_rw" --bs="$_bs" --iodepth="$_qd" --size="$_size" \
        --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 "$@"
}

# fio_bench LABEL DEVICE RW BS IODEPTH SECONDS [JOBS]: a timed fio run (JOBS
# jobs of IODEPTH each, default 1, reported as one group) that prints
# "BENCH LABEL iops=N mibps=N p99_us=N" (the runner collects BENCH lines)
# and appends it to $FIO_BENCH_OUT when that is set. Reads and writes both
# count (a mixed job: summed; p99: the larger of the two directions'
# completion p99). Call it outside a pipeline: it counts a pass or a
# failure. Benchmarks report numbers, they assert nothing about them: only
# that fio ran without error.
fio_bench() {
    _label=$1 _dev=$2 _rw=$3 _bs=$4 _qd=$5 _secs=$6 _jobs=${7:-1}
    _out=$(fio --name=bench --filename="$_dev" --ioengine=libaio --direct=1 \
        --rw="$_rw" --bs="$_bs" --iodepth="$_qd" --numjobs="$_jobs" --group_reporting \
        --runtime="$_secs" --time_based --ramp_time=2 --size=64M --randrepeat=0 --norandommap \
        --output-format=terse --terse-version=3 2>&1)
    _rc=$?
    _line=$(echo "$_out" | grep '^3;' | head -n1)
    # Terse field 5: the job's error (errno), 0 when it had none.
    if [ $_rc -ne 0 ] || [ -z "$_line" ] || [ "$(echo "$_line" | cut -d';' -f5)" != 0 ]; then
        fail "fio bench $_label (exit $_rc)"
        echo "$_out" | tail -n 20 | sed 's/^/    | /'
        return 1
    fi
    # Terse v3: field 7 read KiB/s, 8 read IOPS, 18..37 read completion
    # latency percentiles as "P%=usec"; 48, 49 and 59..78 the same for
    # writes.
    _line=$(echo "$_line" | awk -F';' -v label="$_label" '
        function p99(from, i, a) { for (i = from; i < from + 20; i++) if ($i ~ /^99\.000000%=/) { split($i, a, "="); return a[2] + 0 } return 0 }
        {
            r = p99(18); w = p99(59)
            printf "BENCH %s iops=%d mibps=%.1f p99_us=%d\n", label, $8 + $49, ($7 + $48) / 1024, (r > w ? r : w)
        }')
    echo "$_line"
    [ -n "${FIO_BENCH_OUT:-}" ] && echo "$_line" >>"$FIO_BENCH_OUT"
    pass "fio bench $_label"
}

# AWK_STATS: awk functions the bench summaries share; put it before an
# awk program (awk "$AWK_STATS"'...'):
#   sort(v, n)     sorts v[1..n] ascending, in place (insertion sort: a
#                  summary sorts a handful of rounds)
#   median(v, n)   the median of a sorted v[1..n] (0 when n is 0)
#   kv(name)       the value of the field name=value in the current line
# Locals are extra parameters, so calling them leaves no global changed.
AWK_STATS='
function sort(v, n, i, j, t) { for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t } }
function median(v, n) { return (n < 1) ? 0 : (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
function kv(name, i, a) { for (i = 1; i <= NF; i++) { split($i, a, "="); if (a[1] == name) return substr($i, length(name) + 2) } return "" }
'

# bench_ratios FILE KEY "A/B ..." [GOALS]: from FILE's lines
#   BENCH round=R KEY=HOST job=JOB iops=N mibps=N ...
# prints, for every job (in the order first seen) and every ratio A/B of
# two hosts, the ratio per round (IOPS for jobs named 4k-*, MiB/s for the
# rest), then, after all of those, each host's median and each ratio's
# median and spread (min-max) across rounds:
#   BENCH round=R job=JOB ratio=A/B metric=iops value=X
#   BENCH summary job=JOB KEY=HOST metric=iops median=X min=X max=X rounds=N
#   BENCH summary job=JOB ratio=A/B metric=iops median=X min=X max=X rounds=N values=X,X,X [goal=>=G met=yes|no]
# GOALS: whitespace-separated A/B:JOB:>=G or A/B:JOB:<=G; a goal is a
# report line, never a check (met: the median meets it).
bench_ratios() {
    grep '^BENCH round=' "$1" | awk -v key="$2" -v pairs="$3" -v goals="${4:-}" "$AWK_STATS"'
        {
            r = h = j = io = mb = ""
            for (i = 2; i <= NF; i++) {
                split($i, a, "="); f = a[1]; s = substr($i, length(f) + 2)
                if (f == "round") r = s; else if (f == key) h = s; else if (f == "job") j = s
                else if (f == "iops") io = s; else if (f == "mibps") mb = s
            }
            if (r == "" || h == "" || j == "" || io == "") next
            if (!(j in seenj)) { seenj[j] = 1; jobs[++nj] = j }
            if (!(r in seenr)) { seenr[r] = 1; rounds[++nr] = r }
            if (!(h in seenh)) { seenh[h] = 1; hosts[++nh] = h }
            val[r, h, j] = (j ~ /^4k-/) ? io + 0 : mb + 0
            have[r, h, j] = 1
        }
        END {
            np = split(pairs, pr, " ")
            ng = split(goals, gl, " ")
            for (g = 1; g <= ng; g++) { split(gl[g], ga, ":"); goal[ga[1], ga[2]] = ga[3] }
            for (x = 1; x <= nj; x++) {
                j = jobs[x]; m = (j ~ /^4k-/) ? "iops" : "mibps"
                for (y = 1; y <= nh; y++) {
                    h = hosts[y]; n = 0
                    for (z = 1; z <= nr; z++) if (have[rounds[z], h, j]) hv[++n] = val[rounds[z], h, j]
                    if (n == 0) continue
                    sort(hv, n)
                    out[++no] = sprintf("BENCH summary job=%s %s=%s metric=%s median=%.1f min=%.1f max=%.1f rounds=%d", j, key, h, m, median(hv, n), hv[1], hv[n], n)
                }
                for (p = 1; p <= np; p++) {
                    split(pr[p], ab, "/"); n = 0; list = ""
                    for (z = 1; z <= nr; z++) {
                        r = rounds[z]
                        if (!have[r, ab[1], j] || !have[r, ab[2], j] || val[r, ab[2], j] <= 0) continue
                        q = val[r, ab[1], j] / val[r, ab[2], j]
                        v[++n] = q; list = list (n > 1 ? "," : "") sprintf("%.3f", q)
                        printf "BENCH round=%s job=%s ratio=%s metric=%s value=%.3f\n", r, j, pr[p], m, q
                    }
                    if (n == 0) continue
                    sort(v, n); med = median(v, n)
                    gs = ""
                    if (goal[pr[p], j] != "") {
                        gv = goal[pr[p], j]; lim = substr(gv, 3) + 0
                        met = (substr(gv, 1, 2) == "<=") ? (med <= lim) : (med >= lim)
                        gs = sprintf(" goal=%s met=%s", gv, met ? "yes" : "no")
                    }
                    out[++no] = sprintf("BENCH summary job=%s ratio=%s metric=%s median=%.3f min=%.3f max=%.3f rounds=%d values=%s%s", j, pr[p], m, med, v[1], v[n], n, list, gs)
                }
            }
            for (i = 1; i <= no; i++) print out[i]
        }'
}
