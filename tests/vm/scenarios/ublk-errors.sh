# vm-timeout: 120
# Clear one-line errors from `ublk-nvmf add` in a guest with ublk: target
# unreachable, wrong subsystem NQN, host not allowed; and no device is left.
. /vm/lib.sh
. /vm/ublk.sh

require_cmd ublk-nvmf gimbal-target || exit 1
require_module ublk_drv || exit 1

cat >/tmp/t.toml <<EOC
listen = ["127.0.0.1:4420"]
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:locked"
allowed_hosts = ["nqn.2026-01.io.test:somebody-else"]
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "64MiB"
EOC
start_daemon gimbal gimbal-target run --config /tmp/t.toml
listening() { netstat -ltn 2>/dev/null | grep -q "127.0.0.1:4420 "; }
wait_for "gimbal-target listens" 20 listening

ublk_volume_config /tmp/u.toml u 127.0.0.1 4499 nqn.2026-01.io.gimbal:locked
check_output "unreachable target" "error: .*cannot connect to 127.0.0.1:4499" sh -c '! ublk-nvmf add --config /tmp/u.toml 2>&1'
ublk_volume_config /tmp/n.toml n 127.0.0.1 4420 nqn.2026-01.io.gimbal:wrong
check_output "wrong subsystem NQN" "error: .*no such subsystem NQN" sh -c '! ublk-nvmf add --config /tmp/n.toml 2>&1'
ublk_volume_config /tmp/h.toml h 127.0.0.1 4420 nqn.2026-01.io.gimbal:locked
check_output "host not allowed" "error: .*host NQN not allowed" sh -c '! ublk-nvmf add --config /tmp/h.toml 2>&1'
nodev() { ! ls /dev/ublkb* >/dev/null 2>&1; }
check "no ublk device was left behind" nodev
