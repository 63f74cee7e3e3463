# Helpers for the Linux kernel NVMe/TCP target (nvmet-tcp), configured through
# configfs: the reference peer for our initiator and, with the kernel host
# (nvme-cli), for our target. Source after lib.sh.

NVMET=/sys/kernel/config/nvmet

# nvmet_init: loads nvmet and nvmet-tcp and mounts configfs.
nvmet_init() {
    require_module configfs nvmet nvmet-tcp || return 1
    grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs none /sys/kernel/config
    [ -d "$NVMET" ] || { fail "$NVMET missing after loading nvmet"; return 1; }
}

# nvmet_port ID ADDR PORT: a TCP port on IPv4 ADDR:PORT.
nvmet_port() {
    mkdir -p "$NVMET/ports/$1" &&
        echo tcp >"$NVMET/ports/$1/addr_trtype" &&
        echo ipv4 >"$NVMET/ports/$1/addr_adrfam" &&
        echo "$2" >"$NVMET/ports/$1/addr_traddr" &&
        echo "$3" >"$NVMET/ports/$1/addr_trsvcid"
}

# nvmet_subsys NQN [HOSTNQN...]: a subsystem allowing any host, or only the
# listed host NQNs.
nvmet_subsys() {
    _s=$1
    shift
    mkdir -p "$NVMET/subsystems/$_s" || return 1
    if [ $# -eq 0 ]; then
        echo 1 >"$NVMET/subsystems/$_s/attr_allow_any_host"
    else
        echo 0 >"$NVMET/subsystems/$_s/attr_allow_any_host"
        for _h in "$@"; do
            mkdir -p "$NVMET/hosts/$_h" &&
                ln -s "$NVMET/hosts/$_h" "$NVMET/subsystems/$_s/allowed_hosts/$_h" || return 1
        done
    fi
}

# nvmet_ns NQN NSID PATH: a namespace backed by a block device or file.
nvmet_ns() {
    mkdir -p "$NVMET/subsystems/$1/namespaces/$2" &&
        echo "$3" >"$NVMET/subsystems/$1/namespaces/$2/device_path" &&
        echo 1 >"$NVMET/subsystems/$1/namespaces/$2/enable"
}

# nvmet_link PORT NQN / nvmet_unlink PORT NQN: expose or hide a subsystem on
# a port (unlinking drops the port's connections, which tests reconnects).
nvmet_link() { ln -s "$NVMET/subsystems/$2" "$NVMET/ports/$1/subsystems/$2"; }
nvmet_unlink() { rm -f "$NVMET/ports/$1/subsystems/$2"; }

# nvmet_clear: removes every port, subsystem, namespace and host.
nvmet_clear() {
    for _l in "$NVMET"/ports/*/subsystems/*; do [ -L "$_l" ] && rm -f "$_l"; done
    for _l in "$NVMET"/subsystems/*/allowed_hosts/*; do [ -L "$_l" ] && rm -f "$_l"; done
    for _n in "$NVMET"/subsystems/*/namespaces/*; do
        [ -d "$_n" ] || continue
        echo 0 >"$_n/enable" 2>/dev/null
        rmdir "$_n"
    done
    for _d in "$NVMET"/subsystems/* "$NVMET"/ports/* "$NVMET"/hosts/*; do
        [ -d "$_d" ] && rmdir "$_d"
    done
    return 0
}

# nvme_dev_for NQN: prints the namespace block device (/dev/nvmeXnY) that the
# kernel host created for subsystem NQN, if connected. With native multipath
# the block device hangs off the subsystem (nvme-subsysN/nvmeXnY) and the
# controller only has hidden path nodes (nvmeXcYnZ), so look there first.
nvme_dev_for() {
    for _s in /sys/class/nvme-subsystem/* /sys/class/nvme/*; do
        [ -e "$_s/subsysnqn" ] || continue
        [ "$(cat "$_s/subsysnqn")" = "$1" ] || continue
        for _n in "$_s"/nvme*n*; do
            case "${_n##*/}" in *c*) continue ;; esac
            [ -b "/dev/${_n##*/}" ] && { echo "/dev/${_n##*/}"; return 0; }
        done
    done
    return 1
}
