#!/usr/bin/env bash
# Installs, from Debian's packages, everything the build and the VM bench need.
# Idempotent: a package already installed is not touched, and `apt-get update`
# runs only when something is missing (it is the slow part on a fresh machine).
set -euo pipefail

# Why each package is here:
#   qemu-system-x86           boots the guest kernel (TCG; KVM does not work here)
#   busybox-static            the guest's init, shell and coreutils
#   cpio xz-utils zstd kmod   building the initramfs (depmod, .ko.xz decompression)
#   fio e2fsprogs nvme-cli    the tools the scenarios run inside the guest
#   dmsetup                   dm-log-writes marks and tables (crash-consistency)
#   libclang-dev clang        libublk's -sys crate runs bindgen at build time
#   iperf3                    loopback network baseline for benchmarks
#   systemd                   `systemd-analyze verify` of the shipped units
#   libbpf-dev bpftool        building and inspecting the ionice side channel (BPF)
#   man-db                    `man --warnings -l` on the generated man pages
#   dpkg-dev lintian debootstrap  building the Debian packages (dpkg-shlibdeps),
#                             checking them, a clean root to install them in
#   etcd-server               cluster mode's store: tests start real etcd clusters
#   protobuf-compiler libprotobuf-dev  etcd-client's build script compiles etcd's
#                             .proto files, which import protobuf's well-known types
#                             (google/protobuf/descriptor.proto is in libprotobuf-dev)
#   linux-perf                perf in the guest for the benches' profiles
#                             (BENCH_PERF=1 tests/vm/run --bench ublk)
#   iproute2                  `ss` in the guest: the ublk bench logs each
#                             connection's TCP state (buffers, window, RTT)
#   prometheus                `promtool check metrics`: the metrics tests parse both
#                             daemons' /metrics output with Prometheus' own parser
#                             (the package's service is never enabled by the tests)
PACKAGES=(
    qemu-system-x86 busybox-static cpio xz-utils zstd kmod
    fio e2fsprogs nvme-cli dmsetup libclang-dev clang iperf3 systemd
    libbpf-dev bpftool man-db dpkg-dev lintian debootstrap prometheus
    etcd-server protobuf-compiler libprotobuf-dev linux-perf iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup-host: all packages present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-host: missing packages: ${missing[*]}; run as root (or install them) first" >&2
    exit 1
fi

echo "setup-host: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
