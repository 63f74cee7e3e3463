# vm-timeout: 60
# Must pass: the runner reports success when every check passes.
. /vm/lib.sh
check "true is true" true
check_fails "false is false" false
check_output "uname names Linux" Linux uname -s
