# vm-timeout: 60
# Must fail: one check passes, one asserts something false.
. /vm/lib.sh
check "true is true" true
check_eq "deliberately wrong assertion" 1 2
