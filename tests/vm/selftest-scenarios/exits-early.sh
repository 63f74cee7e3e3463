# vm-timeout: 60
# Must fail: a scenario that stops early (here after one passed check) has
# not checked what it meant to, however many checks passed before.
. /vm/lib.sh
check "reached" true
[ -e /no/such/prerequisite ] || exit 1
check "never reached" true
