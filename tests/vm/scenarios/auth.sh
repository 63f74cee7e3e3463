# vm-timeout: 900
# In-band authentication (DH-HMAC-CHAP) against Linux on both sides:
# - the kernel host (nvme connect --dhchap-secret [--dhchap-ctrl-secret])
#   against gimbal-target, several hash/DH group choices, verified fio; no
#   key or a wrong key is refused, no block device appears, and the target
#   keeps serving;
# - ublk-nvmf against the kernel nvmet target with dhchap_key (and
#   dhchap_ctrl_key) in configfs: the volume comes up, survives a
#   target-side reconnect, and a wrong key is one clear error line;
# - ublk-nvmf against gimbal-target with authentication, through a target
#   restart (a new controller, every queue authenticated again).
. /vm/lib.sh
. /vm/nvmet.sh
. /vm/gimbal.sh
. /vm/ublk.sh

require_cmd nvme gimbal-target ublk-nvmf fio || exit 1
require_module nvme-tcp ublk_drv || exit 1

NQN=nqn.2026-01.io.gimbal:auth
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b7e8e2c-0d0b-4bb2-9d6f-5a8f0c0a0001
HOSTID=6b7e8e2c-0d0b-4bb2-9d6f-5a8f0c0a0001
OTHERNQN=nqn.2014-08.org.nvmexpress:uuid:6b7e8e2c-0d0b-4bb2-9d6f-5a8f0c0a0002

# Keys as an operator makes them: nvme-cli's gen-dhchap-key, transform
# hash SHA-256 (01), SHA-384 (02), none (00).
HKEY=$(nvme gen-dhchap-key -m 1 -n "$HOSTNQN")
CKEY=$(nvme gen-dhchap-key -m 2 -n "$NQN")
WRONG=$(nvme gen-dhchap-key -m 0 -l 32 -n "$HOSTNQN")
case "$HKEY$CKEY$WRONG" in
*DHHC-1:01:*DHHC-1:02:*DHHC-1:00:*) pass "nvme gen-dhchap-key made three keys" ;;
*) fail "nvme gen-dhchap-key: '$HKEY' '$CKEY' '$WRONG'"; exit 1 ;;
esac

# ---- the kernel host against gimbal-target -------------------------------

CONF=/tmp/auth-target.toml
# auth_target_config HASH GROUP: the host may connect only with its key;
# OTHERNQN is allowed without one on a second subsystem (the target must
# keep serving it while a host fails).
auth_target_config() {
    cat >"$CONF" <<EOC
listen = ["127.0.0.1:4420"]
[[host]]
nqn = "$HOSTNQN"
dhchap_secret = "$HKEY"
dhchap_ctrl_secret = "$CKEY"
dhchap_hash = "$1"
dhchap_dhgroup = "$2"
[[subsystem]]
nqn = "$NQN"
allowed_hosts = ["$HOSTNQN"]
require_auth = true
[[subsystem.namespace]]
backend = "file"
path = "/tmp/gimbal-auth.img"
size = "64MiB"
[[subsystem]]
nqn = "$NQN.open"
allow_any_host = true
[[subsystem.namespace]]
backend = "ram"
size = "16MiB"
EOC
    chmod 600 "$CONF"
}

auth_target_config sha256 null
chmod 644 "$CONF"
check_output "a world-readable config with secrets is refused, and says why" \
    "readable by every user" sh -c "gimbal-target check --config $CONF 2>&1; true"
chmod 600 "$CONF"
check "the same file at mode 600 passes" gimbal-target check --config "$CONF"

connect() {
    nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn="$HOSTNQN" \
        --hostid="$HOSTID" --ctrl-loss-tmo=5 "$@"
}
no_device() { ! nvme_ns_dev "$NQN" 1 >/dev/null; }
ctrl_live() { [ "$(cat "/sys/class/nvme/${1#/dev/}/state" 2>/dev/null)" = live ]; }

for choice in "sha256 null" "sha384 ffdhe2048" "sha512 ffdhe3072"; do
    set -- $choice
    stop_daemon gimbal
    auth_target_config "$1" "$2"
    gimbal_start "$CONF" || exit 1
    check "kernel host connects with --dhchap-secret ($1, $2)" connect --dhchap-secret="$HKEY"
    wait_for "namespace appears ($1, $2)" 20 nvme_ns_dev "$NQN" 1
    dev=$(nvme_ns_dev "$NQN" 1)
    fio_verify "fio verify over an authenticated association ($1, $2)" "$dev" randrw 4k 16 8M --bsrange=4k-128k
    check "disconnect ($1, $2)" nvme disconnect -n "$NQN"
    wait_for "device gone ($1, $2)" 20 no_device
    check "kernel host connects with both secrets, the target proves its key ($1, $2)" \
        connect --dhchap-secret="$HKEY" --dhchap-ctrl-secret="$CKEY"
    wait_for "namespace appears, bidirectional ($1, $2)" 20 nvme_ns_dev "$NQN" 1
    dev=$(nvme_ns_dev "$NQN" 1)
    fio_verify "fio verify, bidirectional ($1, $2)" "$dev" randwrite 64k 8 8M
    # A controller reset: the host re-creates every queue, and each one
    # authenticates again.
    ctrl=$(nvme_ctrl_for "$NQN")
    check "nvme reset ($1, $2)" nvme reset "$ctrl"
    wait_for "controller live after the reset ($1, $2)" 30 ctrl_live "$ctrl"
    fio_verify "fio verify after the reset ($1, $2)" "$dev" randrw 16k 8 8M
    check "disconnect, bidirectional ($1, $2)" nvme disconnect -n "$NQN"
    wait_for "device gone, bidirectional ($1, $2)" 20 no_device
done

check_fails "no secret: connect is refused" connect
check "no secret: no block device" no_device
check_fails "a wrong secret: connect is refused" connect --dhchap-secret="$WRONG"
check "a wrong secret: no block device" no_device
check_fails "a wrong controller secret: the host refuses the target" \
    connect --dhchap-secret="$HKEY" --dhchap-ctrl-secret="$WRONG"
check "a wrong controller secret: no block device" no_device
check "the target is still up" daemon_alive gimbal
check_output "it logged the failing host once" "^1$" \
    sh -c "grep -c 'failed DH-HMAC-CHAP authentication' $LOGDIR/daemon-gimbal.log"
check_fails "the log holds no secret" grep -F -e "${HKEY#DHHC-1:01:}" -e "${WRONG#DHHC-1:00:}" "$LOGDIR/daemon-gimbal.log"
check "another host without a key still connects to the open subsystem" \
    nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN.open" --hostnqn="$OTHERNQN"
wait_for "its namespace appears" 20 nvme_ns_dev "$NQN.open" 1
check "disconnect the open subsystem" nvme disconnect -n "$NQN.open"
check "the right key still works after the failures" connect --dhchap-secret="$HKEY"
wait_for "namespace appears again" 20 nvme_ns_dev "$NQN" 1
check "disconnect" nvme disconnect -n "$NQN"

# ---- ublk-nvmf against gimbal-target, through a target restart -----------

# fio_across_start NAME: verified writes on /dev/ublkb0 in the background
# (daemon NAME), to run across an outage; fio_done NAME once it ended.
fio_across_start() {
    start_daemon "$1" fio --name=across --filename=/dev/ublkb0 --ioengine=libaio --direct=1 \
        --rw=randwrite --bs=16k --iodepth=16 --size=16M --verify=crc32c --verify_fatal=1 \
        --do_verify=1 --randrepeat=0 --loops=4
}
fio_done() { ! daemon_alive "$1"; }

# volume_config FILE NAME PORT NQN SECRET [CTRL_SECRET]
volume_config() {
    ublk_volume_config "$1" "$2" 127.0.0.1 "$3" "$4" 1 2
    {
        echo "[host]"
        echo "nqn = \"$HOSTNQN\""
        echo "id = \"$HOSTID\""
        echo "dhchap_secret = \"$5\""
        [ -n "${6:-}" ] && echo "dhchap_ctrl_secret = \"$6\""
    } >>"$1"
    chmod 600 "$1"
}

volume_config /tmp/ga.toml gauth 4420 "$NQN" "$HKEY" "$CKEY"
check_output "ublk-nvmf volume with both keys on gimbal-target" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/ga.toml
fio_verify "ublk over gimbal-target: verify" /dev/ublkb0 randrw 4k 32 16M --bsrange=4k-256k
fio_across_start fio-restart
sleep 2
check "restart gimbal-target under the volume (a new controller)" stop_daemon gimbal
gimbal_start "$CONF" || exit 1
wait_for "fio across the restart finishes" 120 fio_done fio-restart
check_output "fio across the restart: no error" "err= 0" cat "$LOGDIR/daemon-fio-restart.log"
check_output "the volume reconnected (status shows a reset)" '"controller_resets":[1-9]' ublk-nvmf status gauth --json
fio_verify "ublk over gimbal-target after the restart: verify" /dev/ublkb0 randrw 8k 16 8M
check "del gauth" ublk-nvmf del gauth
stop_daemon gimbal

# ---- ublk-nvmf against the kernel nvmet target ---------------------------

nvmet_init || exit 1
KNQN=nqn.2026-01.io.ublk:nvmet-auth
truncate -s 128M /tmp/nvmet-auth.img
nvmet_setup() {
    nvmet_port 1 127.0.0.1 4421 && nvmet_subsys "$KNQN" "$HOSTNQN" &&
        echo "$HKEY" >"$NVMET/hosts/$HOSTNQN/dhchap_key" &&
        echo "$CKEY" >"$NVMET/hosts/$HOSTNQN/dhchap_ctrl_key" &&
        echo "hmac(sha384)" >"$NVMET/hosts/$HOSTNQN/dhchap_hash" &&
        echo "ffdhe2048" >"$NVMET/hosts/$HOSTNQN/dhchap_dhgroup" &&
        nvmet_ns "$KNQN" 1 /tmp/nvmet-auth.img && nvmet_link 1 "$KNQN"
}
check "nvmet: subsystem with dhchap_key, dhchap_ctrl_key, hmac(sha384), ffdhe2048" nvmet_setup
volume_config /tmp/ka.toml kauth 4421 "$KNQN" "$HKEY" "$CKEY"
check_output "ublk-nvmf volume on nvmet with both keys" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/ka.toml
fio_verify "ublk over nvmet (authenticated): verify" /dev/ublkb0 randrw 4k 32 16M --bsrange=4k-256k
fio_across_start fio-unlink
sleep 2
check "nvmet drops the connections (unlink the subsystem)" nvmet_unlink 1 "$KNQN"
sleep 2
check "and serves again (relink)" nvmet_link 1 "$KNQN"
wait_for "fio across the nvmet reconnect finishes" 120 fio_done fio-unlink
check_output "fio across the nvmet reconnect: no error" "err= 0" cat "$LOGDIR/daemon-fio-unlink.log"
check_output "the volume reconnected to nvmet (authenticating again)" '"controller_resets":[1-9]' ublk-nvmf status kauth --json
check "del kauth" ublk-nvmf del kauth
wait_for "/dev/ublkb0 removed" 20 sh -c '! test -e /dev/ublkb0'

volume_config /tmp/kw.toml kwrong 4421 "$KNQN" "$WRONG"
ublk-nvmf add --config /tmp/kw.toml >/tmp/kw.out 2>&1
check_eq "a wrong key: add fails" 1 "$([ -s /tmp/kw.out ] && ! test -e /dev/ublkb0 && echo 1)"
log "add with a wrong key said: $(cat /tmp/kw.out)"
check_output "a wrong key: one line naming DH-HMAC-CHAP" "DH-HMAC-CHAP authentication failed" cat /tmp/kw.out
check_eq "a wrong key: one line" 1 "$(grep -c . /tmp/kw.out)"
check "nvmet teardown" nvmet_clear
