#!/usr/bin/env bash
# Builds the guest initramfs (an uncompressed newc cpio, the fastest for the
# kernel to unpack) from: busybox, the modules in modules.list and their
# dependencies (decompressed, since busybox modprobe cannot load .ko.xz), the
# host's fio, mke2fs, e2fsck, nvme-cli, dmsetup, promtool and etcd, the project's release
# binaries when built, the shared libraries all of these load, and the guest
# scripts.
#
# usage: initramfs.sh KERNEL_DIR OUTPUT.cpio [BINARY...]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
kdir=$1
out=$2
shift 2
version=$(cat "$kdir/version")
work=$(mktemp -d "${TMPDIR:-/tmp}/ublk-nvmf-initramfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,etc/nvme,proc,sys,dev,tmp,run,mnt,var/log}

# --- busybox and its applets (real tools copied later take precedence) ----
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done

# The kernel loads modules on demand (e.g. the crc32c crypto driver ext4
# asks for) through /sbin/modprobe.
ln -s ../bin/busybox "$root/sbin/modprobe"

# --- kernel modules -------------------------------------------------------
mdir="$root/lib/modules/$version"
mkdir -p "$mdir"
grep -v -e '^#' -e '^$' "$here/modules.list" | while read -r mod; do
    # --show-depends lists the module and its dependencies in load order; a
    # module absent from this kernel is left out here and fails the scenario
    # that asks for it, which names it.
    modprobe -S "$version" -d "$kdir/root" --show-depends "$mod" 2>/dev/null || {
        echo "initramfs: kernel $version has no module $mod" >&2
    }
done | awk '$1 == "insmod" {print $2}' | sort -u | while read -r path; do
    rel=${path#"$kdir/root/lib/modules/$version/"}
    dest="$mdir/${rel%.xz}"
    mkdir -p "$(dirname "$dest")"
    case "$path" in
    *.xz) xz -dc "$path" >"$dest" ;;
    *.zst) zstd -qdc "$path" >"$dest" ;;
    *) cp "$path" "$dest" ;;
    esac
done
cp "$kdir/root/lib/modules/$version"/modules.{builtin,builtin.modinfo,order} "$mdir/"
depmod -b "$root" "$version"

# --- tools and their shared libraries -------------------------------------
copy_with_libs() {
    local bin=$1 dest=$2
    cp -L "$bin" "$root$dest"
    # ldd prints "name => /path (addr)" and "/lib64/ld-linux... (addr)".
    ldd "$bin" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
        [ -e "$root$lib" ] && continue
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}
for tool in fio mke2fs e2fsck nvme blkdiscard dmsetup etcd; do
    path=$(command -v "$tool" || true)
    if [ -z "$path" ]; then
        echo "initramfs: host tool $tool not found (run tests/vm/setup-host.sh)" >&2
        exit 1
    fi
    copy_with_libs "$path" "/usr/sbin/$tool"
done
# promtool (Debian's prometheus package): the metrics scenario checks
# what the daemons serve under real load with Prometheus' own parser.
path=$(command -v promtool || true)
if [ -z "$path" ]; then
    echo "initramfs: host tool promtool not found (run tests/vm/setup-host.sh: package prometheus)" >&2
    exit 1
fi
copy_with_libs "$path" /usr/bin/promtool
# ss and nstat (iproute2): the ublk bench logs each connection's TCP state
# and the guest's TCP drop counters with them; optional (the bench skips
# that without them).
for tool in ss nstat; do
    path=$(command -v "$tool" || true)
    if [ -n "$path" ]; then copy_with_libs "$path" "/usr/sbin/$tool"; fi
done
ln -sf mke2fs "$root/usr/sbin/mkfs.ext4"
ln -sf e2fsck "$root/usr/sbin/fsck.ext4"
for bin in "$@"; do
    copy_with_libs "$bin" "/usr/bin/$(basename "$bin")"
done

# --- guest scripts --------------------------------------------------------
cp "$here/guest/init" "$root/init"
chmod +x "$root/init"
mkdir -p "$root/vm/scenarios"
cp "$here"/guest/*.sh "$root/vm/"
# UBLK_NVMF_VM_SCENARIOS points at another scenario directory (the runner's
# self-test uses it).
cp "${UBLK_NVMF_VM_SCENARIOS:-$here/scenarios}"/*.sh "$root/vm/scenarios/"
# Tools outside the repository (e.g. the project's config examples) that
# scenarios read are staged under /vm/files by the runner through
# UBLK_NVMF_VM_FILES (a directory), when set.
if [ -n "${UBLK_NVMF_VM_FILES:-}" ] && [ -d "$UBLK_NVMF_VM_FILES" ]; then
    cp -r "$UBLK_NVMF_VM_FILES" "$root/vm/files"
fi
echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
echo "root:x:0:" >"$root/etc/group"
mkdir -p "$root/root"

mkdir -p "$(dirname "$out")"
(cd "$root" && find . | LC_ALL=C sort | cpio --quiet -o -H newc) >"$out.tmp"
mv "$out.tmp" "$out"
echo "initramfs: $out ($(du -h "$out" | cut -f1), kernel $version)" >&2
