# vm-timeout: 600
# ublk-nvmf volumes under `ublk-nvmf add` against gimbal-target (file
# namespace) and the kernel's nvmet-tcp target (file namespace): verified
# fio randrw bs 4k..1M at iodepth 1/32/128, blkdiscard, fsync-heavy
# writes, status/list/del. The gimbal volume runs with ublk's zero copy
# (the default where the kernel has it, 6.16+: the bench's kernel must),
# the nvmet one with it turned off, the one-line volume without it since
# it asks for data digests: all three verify their data.
. /vm/lib.sh
. /vm/nvmet.sh
. /vm/gimbal.sh
. /vm/ublk.sh

require_cmd ublk-nvmf gimbal-target fio ss || exit 1
# tcp_diag: ss's view of a socket's buffers (below).
require_module ublk_drv tcp_diag || exit 1

# rcvbuf_grown PORT: a client connection to PORT has room for 4 MiB of
# unread data (io::engine::RX_WINDOW_BYTES; half of tcp_rmem's maximum
# where that is less), grown at its first large read.
rcvbuf_grown() {
    _want=$(awk '{ w = int($3 / 2); print (w < 4194304) ? w : 4194304 }' /proc/sys/net/ipv4/tcp_rmem)
    ss -tmnO state established "( dport = :$1 )" | grep -o 'rb[0-9]*' |
        awk -v w="$_want" '{ v = substr($0, 3) + 0; if (v > m) m = v }
            END { print "largest receive buffer", m + 0, "want at least", w; exit !(m >= w && w > 0) }'
}

GNQN=nqn.2026-01.io.gimbal:demo
gimbal_write_config
gimbal_start || exit 1
ublk_volume_config /tmp/g.toml gfile 127.0.0.1 4420 $GNQN 2 2
check_output "add a volume on gimbal-target's file namespace" "^/dev/ublkb0$" ublk-nvmf add --config /tmp/g.toml
check_output "2 queues" "^2$" sh -c 'ls /sys/block/ublkb0/mq | wc -l'
check_output "file namespace: volatile cache advertised" "write back" cat /sys/block/ublkb0/queue/write_cache
check_output "zero copy on (ublk_drv with UBLK_F_AUTO_BUF_REG, Linux 6.16+)" "^  zero copy: on" ublk-nvmf status gfile
ublk_fio_matrix gimbal /dev/ublkb0
fio_verify "gimbal: verify 128k sequential reads (data straight into the pages)" /dev/ublkb0 write 128k 32 32M
check_output "zero copy: read data went straight into the request's pages" '"read_direct_bytes":[1-9]' ublk-nvmf status gfile --json
check_output "zero copy: the rest of the read data was copied in" '"read_copied_bytes":[1-9]' ublk-nvmf status gfile --json
# The matrix's reads of 256 KiB and more: the rest of each one's data was
# read into its pages in one receive, which the socket's low-water mark
# (raised from io_uring, Linux 6.7+) held back until all of it arrived.
check_output "zero copy: large reads' data waited in the kernel for all of it (SO_RCVLOWAT)" '"waited_receives":[1-9]' ublk-nvmf status gfile --json
check "large reads grew the socket's receive buffer (4 MiB unread)" rcvbuf_grown 4420
check_output "zero copy: large writes' data was spliced (the default)" '"spliced_bytes":[1-9]' ublk-nvmf status gfile --json
check_output "zero copy: no write was sent from the request's pages by default" '"write_direct_bytes":0[,}]' ublk-nvmf status gfile --json
# The other way zero copy can send a large write, switched at run time:
# from the request's registered pages (WRITE_FIXED), never in our memory.
check_output "set write_pages_min=32k at run time" "^write_pages_min=32768$" ublk-nvmf set gfile write_pages_min=32k
check_output "set write_pages_min rejects a size under 4k" "4k" sh -c 'ublk-nvmf set gfile write_pages_min=512 2>&1; true'
fio_verify "gimbal, zero copy, writes from the request's pages: verify" /dev/ublkb0 randwrite 128k 32 32M --bsrange=4k-256k
check_output "zero copy: large writes were sent from the request's pages" '"write_direct_bytes":[1-9]' ublk-nvmf status gfile --json
check_output "set write_pages_min back to the default (max)" "^write_pages_min=4294967295$" ublk-nvmf set gfile write_pages_min=max
# Which reads wait in the kernel for all their data (the socket's
# low-water mark), switched at run time: down to 64 KiB, data still right.
check_output "set read_wait_min=64k at run time" "^read_wait_min=65536$" ublk-nvmf set gfile read_wait_min=64k
check_output "set read_wait_min rejects a size under 4k" "4k" sh -c 'ublk-nvmf set gfile read_wait_min=1k 2>&1; true'
fio_verify "gimbal, zero copy, reads of 64k and more wait for all their data: verify" /dev/ublkb0 randwrite 128k 32 32M --bsrange=4k-256k
check_output "set read_wait_min back to the default (256k)" "^read_wait_min=262144$" ublk-nvmf set gfile read_wait_min=default
# A spliced write's PDU headers from the send buffer instead of spliced
# with its data from per-tag copies (the default, which the matrix above
# and the first verify ran), switched at run time: data still right.
check_output "set head_copy_min=max at run time" "^head_copy_min=4294967295$" ublk-nvmf set gfile head_copy_min=max
check_output "set head_copy_min rejects a size under 4k" "4k" sh -c 'ublk-nvmf set gfile head_copy_min=2k 2>&1; true'
fio_verify "gimbal, zero copy, spliced writes' headers sent apart: verify" /dev/ublkb0 randwrite 128k 32 32M --bsrange=4k-256k
check_output "set head_copy_min back to the default (32k)" "^head_copy_min=32768$" ublk-nvmf set gfile head_copy_min=default
check "gimbal: blkdiscard the whole device" blkdiscard_real /dev/ublkb0
check "gimbal: blkdiscard --zeroout 1 MiB" blkdiscard_real -z -o 1048576 -l 1048576 /dev/ublkb0
ublk_fsync_heavy gimbal /dev/ublkb0
check_output "status --json counts flushes" '"flushes":[1-9]' ublk-nvmf status gfile --json
check_output "status --json: no errors" '"errors":0' ublk-nvmf status gfile --json
check "del gfile" ublk-nvmf del gfile
gone() { ! test -e /dev/ublkb0; }
wait_for "/dev/ublkb0 removed" 20 gone

# The one-line form, with nvme-cli's connect options: it writes the volume
# file they imply (where ublk-nvmf@NAME would read it) and serves it.
ONE_BASE="-t tcp -a 127.0.0.1 -s 4420 -n $GNQN --nsid 2 -i 2 --reconnect-delay 1 --hdr-digest --data-digest --config-dir /tmp/etc-ublk"
ONE="$ONE_BASE -Q 64"
check_output "add -t tcp -a ... -n ... (nvme-cli's options)" "^/dev/ublkb0$" ublk-nvmf add $ONE
check_output "it wrote demo-2.toml" "^header_digest = true$" cat /tmp/etc-ublk/demo-2.toml
check_output "the file is private (it may hold keys)" "^600$" stat -c %a /tmp/etc-ublk/demo-2.toml
check_output "2 queues, as -i 2 asked" "^2$" sh -c 'ls /sys/block/ublkb0/mq | wc -l'
check_output "list --json: schema 1" '"schema":1' ublk-nvmf list --json
check_output "list --json: the volume by name" '"name":"demo-2"' ublk-nvmf list --json
check_output "list --json: its device" '"device":"/dev/ublkb0"' ublk-nvmf list --json
check_output "data digests: zero copy off" "^  zero copy: off" ublk-nvmf status demo-2
fio_verify "one-line volume (digests on): verify" /dev/ublkb0 randrw 4k 16 8M --bsrange=4k-128k
check_output "digests on: large writes spliced, with their digests" '"spliced_bytes":[1-9]' ublk-nvmf status demo-2 --json
check "del demo-2" ublk-nvmf del demo-2
wait_for "/dev/ublkb0 removed after the one-line volume" 20 gone
check_output "other settings for an existing name are refused" "exists with other settings" \
    sh -c "! ublk-nvmf add $ONE_BASE -Q 32 2>&1"
check_output "the same options again reuse the file" "^/dev/ublkb0$" ublk-nvmf add $ONE
check "del demo-2 again" ublk-nvmf del demo-2
wait_for "/dev/ublkb0 removed again" 20 gone
stop_daemon gimbal

KNQN=nqn.2026-01.io.ublk:nvmet-file
nvmet_init || exit 1
truncate -s 256M /tmp/nvmet-file.img
nvmet_setup() {
    nvmet_port 1 127.0.0.1 4421 && nvmet_subsys $KNQN &&
        nvmet_ns $KNQN 1 /tmp/nvmet-file.img && nvmet_link 1 $KNQN
}
check "nvmet: file namespace on port 4421" nvmet_setup
ublk_volume_config /tmp/k.toml kfile 127.0.0.1 4421 $KNQN 1 1
sed -i 's/^\[io\]$/[io]\nzero_copy = "off"/' /tmp/k.toml
check_output "add a volume on nvmet" "^/dev/ublkb[0-9]$" ublk-nvmf add --config /tmp/k.toml
check_output "nvmet volume: zero copy off, as configured" "^  zero copy: off" ublk-nvmf status kfile
dev=$(ublk-nvmf list | awk '$2=="kfile"{print $1}')
log "nvmet volume on $dev"
ublk_fio_matrix nvmet "$dev"
check "nvmet: blkdiscard" blkdiscard_real "$dev"
ublk_fsync_heavy nvmet "$dev"
check_output "nvmet: no errors" '"errors":0' ublk-nvmf status kfile --json
check_output "nvmet: large reads' data waited in the kernel for all of it, into the tag buffer" '"waited_receives":[1-9]' ublk-nvmf status kfile --json
check "nvmet: large reads grew the socket's receive buffer" rcvbuf_grown 4421
# Without zero copy a large write's data is in the tag buffer: it went to
# the socket by reference (vmsplice + splice), and the verified runs above
# read back what it carried.
check_output "nvmet: large writes' data was spliced, not copied" '"spliced_bytes":[1-9]' ublk-nvmf status kfile --json
check "del kfile" ublk-nvmf del kfile
check "nvmet teardown" nvmet_clear
