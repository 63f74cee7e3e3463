# vm-timeout: 900
# Crash consistency through the whole stack (issue 15): ext4 on a volume
# served by gimbal-target's `file` backend on a dm-log-writes device, once
# through ublk-nvmf (/dev/ublkb0) and once through the kernel's NVMe/TCP
# host (/dev/nvmeXnY). dm-log-writes records every write in the order it
# became durable on the data device; log-writes-replay rebuilds the device
# as it stood at chosen points, as if the power had failed there.
#
# Per leg:
# 1. mkfs.ext4 (4 KiB blocks: aligned I/O takes gimbal-target's direct
#    io_uring path, FUA writes included), mark "mkfs"; mount; a workload
#    of NFILES files, each written, fsync'd, renamed into place and its
#    directory fsync'd, then mark "durable-N" (so everything in the log
#    before that mark is what fsync N made durable); every 4th file also
#    replaces "current" by rename; umount; tear the stack down (the log is
#    complete once the dm device is removed).
# 2. Replay, in order, to: every durable-N mark, and a sample of the other
#    flush/FUA entries (about FLUSH_SAMPLE of them, evenly spread, always
#    including the last). At each point a copy of the replay is mounted
#    (ext4 recovers its journal, like after a crash), and then
#    - every file whose fsync returned before the point is there, intact;
#    - every file present under its final name is intact (its data was
#      fsync'd before the rename);
#    - "current" holds a whole version, no older than the last durable one;
#    - after umount, e2fsck -fn finds nothing to fix.
# 3. A negative control: at mark durable-K the checker, told that file K+1
#    is durable too, must fail (it would catch a lost fsync).
# 4. Replaying the whole log onto zeros reproduces the data device byte for
#    byte (the replay tool reads the kernel's format correctly).
. /vm/lib.sh
. /vm/gimbal.sh
. /vm/ublk.sh

require_cmd ublk-nvmf gimbal-target log-writes-replay dmsetup nvme || exit 1
require_module dm-log-writes loop ext4 ublk_drv nvme-tcp || exit 1
# No udev in the guest: libdevmapper creates /dev/mapper nodes itself.
export DM_DISABLE_UDEV=1

NQN=nqn.2026-01.io.gimbal:crash
NFILES=20
FLUSH_SAMPLE=10
NEG_K=$((NFILES / 2))
DEV_MB=64
W=/tmp/cc
DM=cc-lw
DATA=/dev/loop0
LOGDEV=/dev/loop1
CHK=/dev/loop3
MNT=/mnt/cc
CHKMNT=/mnt/chk
mkdir -p "$MNT" "$CHKMNT"

mark() { dmsetup message "$DM" 0 mark "$1"; }
# dm_sysfs: /sys/block/dm-N of our dm device.
dm_sysfs() {
    for _b in /sys/block/dm-*; do
        [ "$(cat "$_b/dm/name" 2>/dev/null)" = "$DM" ] && echo "$_b"
    done
}

# --- the stack: loop devices, dm-log-writes, gimbal-target ---------------------
stack_up() {
    rm -rf "$W"
    mkdir -p "$W/src"
    truncate -s "${DEV_MB}M" "$W/data.img" &&
        truncate -s 512M "$W/log.img" &&
        losetup "$DATA" "$W/data.img" &&
        losetup "$LOGDEV" "$W/log.img" &&
        dmsetup create "$DM" --table "0 $(blockdev --getsz "$DATA") log-writes $DATA $LOGDEV" &&
        test -b "/dev/mapper/$DM" || return 1
    cat >"$W/gimbal.toml" <<EOC
listen = ["127.0.0.1:4420"]
[[subsystem]]
nqn = "$NQN"
serial = "CRASH0001"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "file"
path = "/dev/mapper/$DM"
EOC
}

stack_down() {
    stop_daemon gimbal
    dmsetup remove "$DM"
}

# --- the workload -----------------------------------------------------------------
# File i: (i*37 % 61 + 1) KiB of random data; its md5 is line i of sums.
# "current" versions: every 4th i, 8 KiB; "md5 i" lines in cursums.
workload() {
    : >"$W/sums"
    : >"$W/cursums"
    mkdir "$1/d" && sync "$1/d" "$1" && mark ready || return 1
    i=1
    while [ $i -le $NFILES ]; do
        dd if=/dev/urandom of="$W/src/f$i" bs=1k count=$((i * 37 % 61 + 1)) 2>/dev/null &&
            md5sum <"$W/src/f$i" | cut -d' ' -f1 >>"$W/sums" &&
            cp "$W/src/f$i" "$1/d/.f$i.tmp" &&
            sync "$1/d/.f$i.tmp" &&
            mv "$1/d/.f$i.tmp" "$1/d/f$i" &&
            sync "$1/d" || return 1
        if [ $((i % 4)) -eq 0 ]; then
            { echo "version $i" && dd if=/dev/urandom bs=1k count=8 2>/dev/null; } >"$W/src/cur$i" &&
                echo "$(md5sum <"$W/src/cur$i" | cut -d' ' -f1) $i" >>"$W/cursums" &&
                cp "$W/src/cur$i" "$1/d/.cur.tmp" &&
                sync "$1/d/.cur.tmp" &&
                mv "$1/d/.cur.tmp" "$1/d/current" &&
                sync "$1/d" || return 1
        fi
        mark "durable-$i" || return 1
        i=$((i + 1))
    done
}

# --- the checker -------------------------------------------------------------------
# verify_tree DIR K: files 1..K must be there and intact, any other final
# file intact, "current" a whole version >= the last durable one. One
# md5sum and one awk per call: every process costs under TCG.
verify_tree() {
    (cd "$1/d" && for _f in f* current; do [ -e "$_f" ] && echo "$_f"; done | xargs -r md5sum) \
        >"$W/found" || { echo "md5sum could not read every file"; return 1; }
    awk -v k="$2" -v n="$NFILES" '
        FILENAME == ARGV[1] { want["f" FNR] = $1; next }
        FILENAME == ARGV[2] { version[$1] = $2; next }
        { got[$2] = $1 }
        END {
            bad = 0
            for (i = 1; i <= n; i++) {
                f = "f" i
                if (f in got) {
                    if (got[f] != want[f]) { print f ": content differs from what was written"; bad = 1 }
                } else if (i <= k) {
                    print f ": missing, but its fsync returned before this point"; bad = 1
                }
            }
            w = int(k / 4) * 4
            if ("current" in got) {
                v = version[got["current"]]
                if (v == "") { print "current: not any version that was written"; bad = 1 }
                else if (v + 0 < w) { print "current: version " v ", but version " w " was durable"; bad = 1 }
            } else if (w > 0) {
                print "current: missing, but version " w " was durable"; bad = 1
            }
            exit bad
        }' "$W/sums" "$W/cursums" "$W/found"
}

# verify_point K: mounts a copy of the replay (journal recovery), checks the
# tree against K durable files, unmounts, e2fsck -fn.
verify_point() {
    local _rc=0
    cp "$W/replay.img" "$W/chk.img" && losetup "$CHK" "$W/chk.img" || return 1
    if mount -t ext4 "$CHK" "$CHKMNT"; then
        if [ -d "$CHKMNT/d" ]; then
            verify_tree "$CHKMNT" "$1" || _rc=1
        elif [ "$1" -gt 0 ]; then
            echo "directory d missing"
            _rc=1
        fi
        umount "$CHKMNT" || _rc=1
        e2fsck -fn "$CHK" || _rc=1
    else
        echo "mount failed"
        _rc=1
    fi
    losetup -d "$CHK"
    rm -f "$W/chk.img"
    return $_rc
}

# replay_to ENTRY: continues the replay from where it stopped.
replay_to() {
    local _out
    _out=$(log-writes-replay --log "$LOGDEV" --replay "$W/replay.img" \
        --start-entry "$NEXT" --until-entry "$1") || { echo "$_out"; return 1; }
    NEXT=$(echo "$_out" | sed -n 's/^next-entry //p')
}

# check_log LEG: replays to the chosen points and checks each.
check_log() {
    local _leg=$1 _list=$W/list _entries _mkfs _marks _flushes _fua _discards _step _npoints _k _p _label
    blockdev --flushbufs "$LOGDEV"
    check "$_leg: log lists" sh -c "log-writes-replay --log $LOGDEV --list >$_list" || return 1
    _entries=$(sed -n 's/^# entries \([0-9]*\) .*/\1/p' "$_list")
    _mkfs=$(awk '$5 == "mkfs" {print $1}' "$_list")
    _marks=$(awk '$5 ~ /^durable-/' "$_list" | wc -l)
    _flushes=$(awk -v m="${_mkfs:-0}" '$1 > m && $2 ~ /FLUSH|FUA/' "$_list" | wc -l)
    _fua=$(awk '$2 ~ /FUA/' "$_list" | wc -l)
    _discards=$(awk '$2 ~ /DISCARD/' "$_list" | wc -l)
    log "$_leg: $_entries entries ($_fua FUA, $_discards discards), $_flushes flush/FUA points after mkfs, $_marks durable marks"
    check_eq "$_leg: every durable mark is in the log" "$NFILES" "$_marks"
    check_output "$_leg: the log ends with the kernel's end mark" " dm-log-writes-end$" tail -n1 "$_list"
    [ -n "$_mkfs" ] || { fail "$_leg: no mkfs mark in the log"; return 1; }

    # Points: every durable mark, and every STEP-th flush point plus the
    # last, as "INDEX LABEL" sorted by index; K = durable marks at or before.
    _step=$(((_flushes + FLUSH_SAMPLE - 1) / FLUSH_SAMPLE))
    [ "$_step" -ge 1 ] || _step=1
    awk -v m="$_mkfs" -v step="$_step" -v n="$_flushes" '
        $1 > m && $5 ~ /^durable-/ { print $1, $5; next }
        $1 > m && $2 ~ /FLUSH|FUA/ { f++; if (f % step == 0 || f == n) print $1, $2 }
    ' "$_list" >"$W/points"
    _npoints=$(wc -l <"$W/points")
    log "$_leg: checking $_npoints points: $_marks marks and $((_npoints - _marks)) of $_flushes flush points (every ${_step}th and the last)"

    rm -f "$W/replay.img"
    truncate -s "${DEV_MB}M" "$W/replay.img"
    NEXT=0
    check "$_leg: replay to mark mkfs" replay_to "$_mkfs" &&
        check "$_leg: at mkfs: e2fsck clean" verify_point 0 || return 1
    _k=0
    while read -r _p _label <&3; do
        case "$_label" in durable-*) _k=${_label#durable-} ;; esac
        if ! replay_to "$_p"; then
            fail "$_leg: replay to entry $_p"
            return 1
        fi
        check "$_leg: entry $_p ($_label, $_k durable): files intact, e2fsck clean" verify_point "$_k"
        if [ "$_label" = "durable-$NEG_K" ]; then
            check "$_leg: negative control: claiming f$((NEG_K + 1)) durable at durable-$NEG_K is caught" \
                negative_control
        fi
    done 3<"$W/points"
    check "$_leg: replay the rest of the log" replay_to $((_entries - 1))
    check "$_leg: the full replay equals the data device byte for byte" cmp "$W/replay.img" "$W/data.img"
}

# negative_control: at mark durable-NEG_K, the checker must report file
# NEG_K+1 as missing when told it is durable (so it would catch a lost fsync).
negative_control() {
    local _out
    if _out=$(verify_point $((NEG_K + 1)) 2>&1); then
        echo "the checker passed a file that cannot be there yet"
        return 1
    fi
    echo "$_out"
    echo "$_out" | grep -q "^f$((NEG_K + 1)): missing"
}

# stack_reset: undoes whatever an earlier, failed leg left behind.
stack_reset() {
    umount "$CHKMNT" "$MNT" 2>/dev/null
    ublk-nvmf del cc 2>/dev/null
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    stop_daemon gimbal
    dmsetup remove "$DM" 2>/dev/null
    for _l in "$CHK" "$LOGDEV" "$DATA"; do losetup -d "$_l" 2>/dev/null; done
    return 0
}

# run_leg LEG UP DOWN: the workload on the device UP attaches, then checks.
run_leg() {
    local _leg=$1 _up=$2 _down=$3 _t0
    stack_reset
    check "$_leg: stack up (loop, dm-log-writes, gimbal config)" stack_up || return 1
    gimbal_start "$W/gimbal.toml" || return 1
    $_up || return 1
    log "$_leg: file system on $FSDEV (write_cache $(cat /sys/block/${FSDEV#/dev/}/queue/write_cache)," \
        "fua $(cat /sys/block/${FSDEV#/dev/}/queue/fua); dm-log-writes device fua" \
        "$(cat "$(dm_sysfs)/queue/fua"))"
    check "$_leg: mkfs.ext4" mkfs_ext4 -b 4096 -E lazy_itable_init=0,lazy_journal_init=0 "$FSDEV" &&
        check "$_leg: mark mkfs" sh -c "sync && dmsetup message $DM 0 mark mkfs" &&
        check "$_leg: mount" mount -t ext4 "$FSDEV" "$MNT" || return 1
    _t0=$(cut -d. -f1 /proc/uptime)
    check "$_leg: workload: $NFILES files written, fsync'd, renamed, dir fsync'd" workload "$MNT"
    log "$_leg: workload took $(($(cut -d. -f1 /proc/uptime) - _t0)) s"
    check "$_leg: umount" umount "$MNT"
    mark umount
    $_down
    check "$_leg: stack down (gimbal stopped, dm device removed)" stack_down || return 1
    losetup -d "$DATA" 2>/dev/null
    _t0=$(cut -d. -f1 /proc/uptime)
    check_log "$_leg"
    log "$_leg: replay checks took $(($(cut -d. -f1 /proc/uptime) - _t0)) s"
    losetup -d "$LOGDEV"
}

ublk_up() {
    ublk_volume_config "$W/vol.toml" cc 127.0.0.1 4420 "$NQN" 1
    check_output "ublk: add the volume" '^/dev/ublkb0$' ublk-nvmf add --config "$W/vol.toml" || return 1
    FSDEV=/dev/ublkb0
}
ublk_down() {
    check "ublk: del the volume" ublk-nvmf del cc
    wait_for "ublk: /dev/ublkb0 removed" 20 sh -c '! test -e /dev/ublkb0'
}

nvme_up() {
    check "nvme: connect" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" || return 1
    wait_for "nvme: namespace device appears" 20 nvme_ns_dev "$NQN" 1 || return 1
    FSDEV=$(nvme_ns_dev "$NQN" 1)
}
nvme_down() {
    check "nvme: disconnect" nvme disconnect -n "$NQN"
}

run_leg ublk ublk_up ublk_down
run_leg nvme-host nvme_up nvme_down
finish
