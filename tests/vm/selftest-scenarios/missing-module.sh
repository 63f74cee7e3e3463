# vm-timeout: 60
# Must fail: a scenario whose kernel feature is missing never passes.
. /vm/lib.sh
check "true is true" true
require_module no_such_module_for_selftest || exit 1
check "never reached" true
