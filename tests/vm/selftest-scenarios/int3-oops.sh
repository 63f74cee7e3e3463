# vm-timeout: 60
# Must fail, after a second boot: a guest kernel that dies of an int3 oops
# after the scenario started (the TCG text-patching flake the runner boots
# again for) gets one more boot, and a second death still fails. The
# "oops" line is printed here; the crash is real (sysrq), so no
# VM-SCENARIO-END is printed.
. /vm/lib.sh
check "started" true
echo "[    7.516689] Oops: int3: 0000 [#1] SMP NOPTI (selftest)" >/dev/console
echo c >/proc/sysrq-trigger
sleep 30
