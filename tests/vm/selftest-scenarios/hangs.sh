# vm-timeout: 25
# Must be killed at its limit: it never finishes.
. /vm/lib.sh
check "about to hang" true
sleep 100000
