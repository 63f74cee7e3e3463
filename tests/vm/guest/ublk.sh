# Helpers for ublk-nvmf scenarios. Source after lib.sh.

# ublk_volume_config FILE NAME ADDR PORT NQN [NSID] [QUEUES]: a volume config.
ublk_volume_config() {
    cat >"$1" <<EOC
name = "$2"
[target]
address = "$3"
port = $4
subnqn = "$5"
nsid = ${6:-1}
[io]
queues = ${7:-1}
queue_depth = 128
io_timeout = 30
[reconnect]
reconnect_delay = 1
ctrl_loss_tmo = 120
EOC
}

# ublk_fio_matrix LABEL DEV: verified randrw, bs 4k..1M, at iodepth 1, 32, 128.
ublk_fio_matrix() {
    fio_verify "$1: verify randrw 4k qd1" "$2" randrw 4k 1 8M
    fio_verify "$1: verify randrw 4k..1M qd32" "$2" randrw 4k 32 48M --bsrange=4k-1M
    fio_verify "$1: verify randrw 4k..1M qd128" "$2" randrw 4k 128 48M --bsrange=4k-1M
}

# ublk_fsync_heavy LABEL DEV: small writes with an fsync after each.
ublk_fsync_heavy() {
    check "$1: fsync after every 4k write" fio --name=fsync --filename="$2" --ioengine=sync \
        --rw=randwrite --bs=4k --size=2M --fsync=1 --verify=crc32c --verify_fatal=1
}
