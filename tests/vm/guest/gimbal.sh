# Helpers for running our gimbal-target inside the guest. Source after
# lib.sh.

GIMBAL_CONF=/tmp/gimbal-target.toml

# gimbal_write_config FILE: writes a target config with three namespaces
# in one subsystem: ram (nsid 1), file on tmpfs (nsid 2), null (nsid 3),
# listening on 127.0.0.1:${GIMBAL_PORT:-4420}, any host allowed.
gimbal_write_config() {
    cat >"${1:-$GIMBAL_CONF}" <<EOC
listen = ["127.0.0.1:${GIMBAL_PORT:-4420}"]
[[subsystem]]
nqn = "${GIMBAL_NQN:-nqn.2026-01.io.gimbal:demo}"
model = "gimbal-target vm"
serial = "GIMBALVM0001"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "256MiB"
[[subsystem.namespace]]
nsid = 2
backend = "file"
path = "/tmp/gimbal-ns2.img"
size = "256MiB"
[[subsystem.namespace]]
nsid = 3
backend = "null"
size = "1GiB"
EOC
}

# gimbal_listening [PORT]: true once something listens on the port.
gimbal_listening() {
    netstat -ltn 2>/dev/null | grep -q "127.0.0.1:${1:-${GIMBAL_PORT:-4420}} "
}

# gimbal_start [CONFIG]: starts the target as daemon "gimbal" and waits
# until it listens.
gimbal_start() {
    start_daemon gimbal gimbal-target run --config "${1:-$GIMBAL_CONF}"
    wait_for "gimbal-target listens" 20 gimbal_listening
}

# gimbal_file_target_conf PREFIX N NQN SERIAL SIZE: /tmp/PREFIXN.toml, target
# N of a multi-target scenario: 127.0.0.1:442N, subsystem NQN, one file
# namespace (nsid 1, /tmp/PREFIXN.img of SIZE), any host allowed.
gimbal_file_target_conf() {
    cat >"/tmp/$1$2.toml" <<EOC
listen = ["127.0.0.1:442$2"]
[[subsystem]]
nqn = "$3"
serial = "$4"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "file"
path = "/tmp/$1$2.img"
size = "$5"
EOC
}

# gimbal_file_target_start PREFIX N: starts target N (daemon tN) from
# /tmp/PREFIXN.toml and waits until it listens.
gimbal_file_target_start() {
    start_daemon "t$2" gimbal-target run --config "/tmp/$1$2.toml"
    wait_for "target $2 listens" 20 gimbal_listening 442"$2"
}

# nvme_ns_dev NQN NSID: the kernel host's block device for namespace NSID
# of subsystem NQN (block device names count instances, not NSIDs).
nvme_ns_dev() {
    for _s in /sys/class/nvme-subsystem/* /sys/class/nvme/*; do
        [ -e "$_s/subsysnqn" ] || continue
        [ "$(cat "$_s/subsysnqn")" = "$1" ] || continue
        for _n in "$_s"/nvme*n*; do
            case "${_n##*/}" in *c*) continue ;; esac
            [ "$(cat "/sys/block/${_n##*/}/nsid" 2>/dev/null)" = "$2" ] || continue
            [ -b "/dev/${_n##*/}" ] && { echo "/dev/${_n##*/}"; return 0; }
        done
    done
    return 1
}

# nvme_ctrl_for NQN: the kernel host's controller device (/dev/nvmeX)
# connected to subsystem NQN.
nvme_ctrl_for() {
    for _c in /sys/class/nvme/nvme*; do
        [ "$(cat "$_c/subsysnqn" 2>/dev/null)" = "$1" ] && { echo "/dev/${_c##*/}"; return 0; }
    done
    return 1
}
