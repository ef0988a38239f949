# Sourced by ci/test: tiers that run beside others, at a lower CPU priority,
# on the CPU the foreground leaves idle (the tests and the VM tiers wait on
# I/O, SSH and guests much of the time). Each job's output goes to its log,
# printed when it is joined; a job still running when ci/test ends early is
# stopped with everything it started.
# shellcheck shell=sh

background_dir=${background_dir:-$PWD/target/background}
background_jobs=

# background NAME NICENESS COMMAND...: starts COMMAND in its own session.
background() {
    name=$1 niceness=$2
    shift 2
    mkdir -p "$background_dir"
    rm -f "$background_dir/$name.exit"
    date +%s > "$background_dir/$name.start"
    # A new session is a new autogroup when the kernel groups tasks by
    # session (sched(7)), and autogroups share the CPU equally whatever
    # their tasks' nice values: the job's group gets the niceness too.
    # Its exit status goes to NAME.exit, which `after` waits for.
    # shellcheck disable=SC2016 # expanded by the job's shell
    setsid sh -c 'exit_file=$0 niceness=$1; shift
        if [ -w /proc/self/autogroup ]; then echo "$niceness" > /proc/self/autogroup; fi
        status=0; nice -n "$niceness" "$@" || status=$?
        echo "$status" > "$exit_file"; exit "$status"' \
        "$background_dir/$name.exit" "$niceness" "$@" > "$background_dir/$name.log" 2>&1 < /dev/null &
    echo $! > "$background_dir/$name.pid"
    background_jobs="$background_jobs $name"
    trap stop_background EXIT
    echo "ci/test: $name runs in the background (nice $niceness; log: $background_dir/$name.log)"
}

# after NAME: a command that waits until the background job NAME has ended
# (whatever its status, which its own join reports), for a job to start
# with: `background B 19 sh -c "$(after A) && exec COMMAND"`.
after() { echo "until [ -e '$background_dir/$1.exit' ]; do sleep 5; done"; }

# stop_background: stops every job not joined yet (and what it started).
stop_background() {
    for name in $background_jobs; do
        kill -TERM -- "-$(cat "$background_dir/$name.pid")" 2> /dev/null || true
    done
}

# join NAME: waits for NAME, prints its log, and fails when it failed.
join() {
    name=$1
    t_join=$(date +%s)
    status=0
    wait "$(cat "$background_dir/$name.pid")" || status=$?
    background_jobs=$(echo "$background_jobs" | tr ' ' '\n' | grep -vx "$name" | tr '\n' ' ')
    log=$background_dir/$name.log
    cat "$log"
    # The log's last write is when the job ended.
    echo "ci/test: $name ran $(( $(stat -c %Y "$log") - $(cat "$background_dir/$name.start") ))s in the background; waited $(( $(date +%s) - t_join ))s for it"
    [ "$status" = 0 ] || { echo "ci/test: $name FAILED (exit $status)" >&2; exit 1; }
}
