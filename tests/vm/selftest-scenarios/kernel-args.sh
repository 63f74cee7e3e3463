# vm-timeout: 60
# Must pass only when the runner is given --kernel-args: what it appends
# reaches the guest kernel's command line (the benches' experiments on the
# guest's own settings, e.g. init_on_alloc=0, depend on it).
. /vm/lib.sh
check_output "the runner's --kernel-args reach /proc/cmdline" "selftest_marker=42" cat /proc/cmdline
