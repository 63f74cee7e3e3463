# vm-timeout: 60
# Must fail: a scenario that checks nothing proves nothing.
. /vm/lib.sh
log "doing nothing"
