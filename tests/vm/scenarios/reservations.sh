# vm-timeout: 600
# NVMe reservations: the kernel host's nvme-cli against gimbal-target
# (issue 17). The guest connects twice to one subsystem with two host
# NQNs and host IDs (two controllers, two registrants) and drives
# resv-register/acquire/report/release through each controller's char
# device (nvme-cli passes -n to the controller, so each command is that
# host's), checks reports (plain, --eds, JSON), that a non-holder's write
# fails with Reservation Conflict (nvme write, and dd on the block device),
# preempt-and-abort, release, clear, and that a reservation with PTPL set
# survives a target restart on a file backend.
. /vm/lib.sh
. /vm/gimbal.sh

require_cmd nvme gimbal-target dd || exit 1
require_module nvme-tcp || exit 1

NQN=nqn.2026-01.io.gimbal:resv
HA=nqn.2014-08.org.nvmexpress:uuid:5e5e0000-0000-4000-8000-0000000000a1
IA=5e5e0000-0000-4000-8000-0000000000a1
HB=nqn.2014-08.org.nvmexpress:uuid:5e5e0000-0000-4000-8000-0000000000b1
IB=5e5e0000-0000-4000-8000-0000000000b1
CONF=/tmp/resv-target.toml
# How nvme-cli names the status (its text, or the NVMe name).
RC="[Rr]eservation.?[Cc]onflict|RESERVATION_CONFLICT"
cat >"$CONF" <<EOC
listen = ["127.0.0.1:4420", "127.0.0.2:4420"]
[[subsystem]]
nqn = "$NQN"
allow_any_host = true
[[subsystem.namespace]]
backend = "file"
path = "/tmp/resv.img"
size = "64MiB"
EOC
rm -f /tmp/resv.img /tmp/resv.img.resv
gimbal_start "$CONF" || exit 1

# connect ADDR HOSTNQN HOSTID. nvme-cli 2.3 takes a second connection to
# the same subsystem and address for a duplicate even under another host
# NQN (--duplicate-connect notwithstanding), so host B uses the target's
# second address.
connect() {
    nvme connect -t tcp -a "$1" -s 4420 -n "$NQN" --hostnqn="$2" --hostid="$3" \
        --ctrl-loss-tmo=60 --reconnect-delay=1
}
# ctrl_of HOSTNQN: the controller char device of that host's connection.
ctrl_of() {
    for _c in /sys/class/nvme/nvme*; do
        [ "$(cat "$_c/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
        [ "$(cat "$_c/hostnqn" 2>/dev/null)" = "$1" ] || continue
        echo "/dev/${_c##*/}"
        return 0
    done
    return 1
}
ctrl_live() { [ "$(cat "/sys/class/nvme/${1#/dev/}/state" 2>/dev/null)" = live ]; }

check "host A connects" connect 127.0.0.1 "$HA" "$IA"
check "host B connects (another host NQN and ID)" connect 127.0.0.2 "$HB" "$IB"
wait_for "host A's controller" 20 ctrl_of "$HA"
wait_for "host B's controller" 20 ctrl_of "$HB"
CA=$(ctrl_of "$HA")
CB=$(ctrl_of "$HB")
log "host A: $CA, host B: $CB"
check_eq "two controllers" 1 "$([ -n "$CA" ] && [ -n "$CB" ] && [ "$CA" != "$CB" ] && echo 1)"
check_output "Identify Namespace advertises every reservation type (RESCAP)" \
    "rescap *: *0xff" nvme id-ns "$CA" -n 1
check_output "Identify Controller advertises reservations (ONCS bit 5)" \
    "oncs *: *0x(2|3|6|7)[0-9a-f]" nvme id-ctrl "$CA"

dd if=/dev/urandom of=/tmp/blk bs=512 count=1 2>/dev/null
# as HOST: the I/O commands through that host's controller.
write_as() { nvme write "$1" -n 1 -s 0 -c 0 -z 512 -d /tmp/blk; }
read_as() { nvme read "$1" -n 1 -s 0 -c 0 -z 512 -d /tmp/rblk; }
report() { nvme resv-report "$@" -n 1 --eds; }

check "A registers key 0xa1" nvme resv-register "$CA" -n 1 --nrkey=0xa1 --rrega=0
check "B registers key 0xb1" nvme resv-register "$CB" -n 1 --nrkey=0xb1 --rrega=0
check_fails "B registering another key conflicts" nvme resv-register "$CB" -n 1 --nrkey=0xb2 --rrega=0
check "A acquires Write Exclusive" nvme resv-acquire "$CA" -n 1 --crkey=0xa1 --rtype=1 --racqa=0
check_fails "B cannot acquire while A holds" nvme resv-acquire "$CB" -n 1 --crkey=0xb1 --rtype=1 --racqa=0
check_output "report --eds: Write Exclusive" "rtype *: *1" report "$CA"
check_output "report --eds: two registrants" "regctl *: *2" report "$CA"
check_output "report --eds: A's key, held" "rcsts *: *1" report "$CA"
check_output "report --eds: B's key" "rkey *: *b1" report "$CB"
check_output "report -e (short option) too" "regctl *: *2" nvme resv-report "$CB" -n 1 -e
check_output "report in JSON" '"regctl" *: *2' nvme resv-report "$CA" -n 1 --eds -o json
check_output "report in JSON: the type" '"rtype" *: *1' nvme resv-report "$CA" -n 1 --eds -o json
# 128-bit host IDs: a report without the extended structure is refused
# (Host Identifier Inconsistent Format), as nvmet does.
check_fails "report without --eds is refused" nvme resv-report "$CA" -n 1

check "the holder writes" write_as "$CA"
check_output "B's write fails with Reservation Conflict" "$RC" \
    sh -c "! nvme write $CB -n 1 -s 0 -c 0 -z 512 -d /tmp/blk 2>&1"
check "B may still read under Write Exclusive" read_as "$CB"

check "A releases" nvme resv-release "$CA" -n 1 --crkey=0xa1 --rtype=1 --rrela=0
check_output "no reservation after the release" "rtype *: *0" report "$CA"
check "B writes again" write_as "$CB"
check "B acquires Exclusive Access" nvme resv-acquire "$CB" -n 1 --crkey=0xb1 --rtype=2 --racqa=0
check_fails "A cannot read under B's Exclusive Access" read_as "$CA"
check_fails "A cannot write under B's Exclusive Access" write_as "$CA"

# Fencing: A preempts B and aborts its commands.
check "A preempts B (preempt and abort)" \
    nvme resv-acquire "$CA" -n 1 --crkey=0xa1 --prkey=0xb1 --rtype=2 --racqa=2
check_output "after the preempt: one registrant" "regctl *: *1" report "$CB"
check_output "after the preempt: A holds Exclusive Access" "rtype *: *2" report "$CB"
check_output "B's write is refused after the preempt" "$RC" \
    sh -c "! nvme write $CB -n 1 -s 0 -c 0 -z 512 -d /tmp/blk 2>&1"
check "A writes" write_as "$CA"
check_output "B's notification log holds Registration Preempted (type 1)" \
    "^0000: ([0-9a-f]{2} ){8}01" nvme get-log "$CB" --log-id=0x80 --log-len=64

check "B registers again" nvme resv-register "$CB" -n 1 --nrkey=0xb1 --rrega=0
check "B clears everything" nvme resv-release "$CB" -n 1 --crkey=0xb1 --rrela=1
check_output "after the clear: no registrant" "regctl *: *0" report "$CA"
check "B writes after the clear" write_as "$CB"

# Persist Through Power Loss on the file backend.
check "A registers with PTPL set" nvme resv-register "$CA" -n 1 --nrkey=0xa1 --rrega=0 --cptpl=3
check "A acquires Write Exclusive again" nvme resv-acquire "$CA" -n 1 --crkey=0xa1 --rtype=1 --racqa=0
check_output "report: PTPL state 1" "ptpls *: *1" report "$CA"
check "the sidecar file is there" test -s /tmp/resv.img.resv
stop_daemon gimbal
gimbal_start "$CONF" || exit 1
wait_for "host A reconnects" 60 ctrl_live "$CA"
wait_for "host B reconnects" 60 ctrl_live "$CB"
check_output "after the restart: still Write Exclusive" "rtype *: *1" report "$CB"
check_output "after the restart: A still registered and holding" "rcsts *: *1" report "$CB"
check_output "after the restart: B's write still conflicts" "$RC" \
    sh -c "! nvme write $CB -n 1 -s 0 -c 0 -z 512 -d /tmp/blk 2>&1"

# The block layer: with only B's controller left, a direct write to the
# namespace's block device fails (the kernel maps Reservation Conflict to
# an I/O error), and A's data stays.
check "A disconnects" nvme disconnect -d "${CA#/dev/}"
wait_for "the block device is B's" 20 nvme_ns_dev "$NQN" 1
DEV=$(nvme_ns_dev "$NQN" 1)
check_fails "dd oflag=direct from the non-holder fails" \
    dd if=/dev/zero of="$DEV" bs=4096 count=1 oflag=direct
check "dd reads the namespace (Write Exclusive allows reads)" \
    dd if="$DEV" of=/dev/null bs=4096 count=1 iflag=direct
check "B disconnects" nvme disconnect -d "${CB#/dev/}"
check "the target is still up" daemon_alive gimbal
