# Sourced by the VM tiers (ci/vm-smoke, ci/device): boots an image with
# `imgbuild vm` in the background and drives the guest with a real OpenSSH
# client. QEMU goes with imgbuild on every path (imgbuild kills it on
# SIGTERM); `vm_stop` powers the guest off in order.
#
# The caller sets: bin (imgbuild), key (a private key, mode 600) and defines
# fail MESSAGE. The EXIT trap kills a VM still running, then runs the
# caller's `on_exit` if it set one.

now() { date +%s; }

# vm_start DIR IMAGE [imgbuild vm options]: boots IMAGE under UEFI, console
# in DIR/console.log. Sets vm_pid, vm_port, vm_dir, vm_started.
vm_start() {
    vm_dir=$1
    image=$2
    shift 2
    mkdir -p "$vm_dir"
    vm_started=$(now)
    "$bin" vm "$image" --uefi --console "$vm_dir/console.log" "$@" \
        > "$vm_dir/vm.stdout" 2> "$vm_dir/vm.stderr" &
    vm_pid=$!
    trap 'vm_kill; ${on_exit:-:}' EXIT
    trap 'exit 1' INT TERM
    vm_port=
    for _ in $(seq 1 60); do
        vm_port=$(sed -n 's/.*ssh -p \([0-9][0-9]*\) root@127\.0\.0\.1.*/\1/p' "$vm_dir/vm.stderr" | head -n 1)
        [ -n "$vm_port" ] && break
        kill -0 "$vm_pid" 2>/dev/null || { cat "$vm_dir/vm.stderr" >&2; fail "imgbuild vm ended before starting QEMU"; }
        sleep 0.5
    done
    [ -n "$vm_port" ] || { cat "$vm_dir/vm.stderr" >&2; fail "imgbuild vm never printed the SSH command"; }
    cat "$vm_dir/vm.stderr"
}

# Kills the VM (imgbuild takes QEMU with it); for failures.
vm_kill() {
    if [ -n "${vm_pid:-}" ] && kill -0 "$vm_pid" 2>/dev/null; then
        kill -TERM "$vm_pid" 2>/dev/null || true
        wait "$vm_pid" 2>/dev/null || true
    fi
}

# guest COMMAND: runs COMMAND in the guest. A connection whose guest went
# away (a reboot) ends after 20 s of silence, not never, and no command runs
# longer than $guest_timeout (default 900 s).
guest() {
    timeout "${guest_timeout:-900}" ssh -i "$key" -p "$vm_port" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
        -o BatchMode=yes -o ConnectTimeout=5 -o ServerAliveInterval=5 -o ServerAliveCountMax=4 \
        -o LogLevel=ERROR root@127.0.0.1 "$@"
}

# poll_guest SECONDS WHAT CHECK...: runs CHECK every 2 s until it succeeds;
# fails, with the console's tail, when the VM ends or SECONDS pass first.
poll_guest() {
    limit=$1
    what=$2
    shift 2
    deadline=$(( $(now) + limit ))
    until "$@"; do
        if ! kill -0 "$vm_pid" 2>/dev/null; then
            cat "$vm_dir/vm.stderr" >&2
            fail "the VM ended before $what; console: $vm_dir/console.log"
        fi
        if [ "$(now)" -ge "$deadline" ]; then
            tail -n 40 "$vm_dir/console.log" >&2 || true
            fail "no $what within $limit s; console: $vm_dir/console.log"
        fi
        sleep 2
    done
}

ssh_answers() { guest true 2>/dev/null; }

# wait_ssh SECONDS: until the guest answers over SSH; the seconds since
# vm_start are in ssh_seconds.
wait_ssh() {
    poll_guest "$1" "SSH" ssh_answers
    ssh_seconds=$(( $(now) - vm_started ))
}

# boot_id: the guest's boot id, or nothing within 15 s (a poll never stalls
# on a connection the rebooting guest left half-open).
boot_id() {
    guest_timeout=15
    guest cat /proc/sys/kernel/random/boot_id
    boot_id_status=$?
    guest_timeout=
    return $boot_id_status
}

booted_again() {
    new_boot=$(boot_id 2>/dev/null || true)
    [ -n "$new_boot" ] && [ "$new_boot" != "$old_boot" ]
}

# reboot_guest SECONDS: reboots over SSH and waits for a new boot (a new
# boot_id) to answer; the time it took is in reboot_seconds.
reboot_guest() {
    old_boot=$(boot_id)
    t_reboot=$(now)
    guest 'systemctl reboot' 2>/dev/null || true
    poll_guest "$1" "new boot" booted_again
    reboot_seconds=$(( $(now) - t_reboot ))
}

# vm_stop: an orderly power-off over SSH; imgbuild vm must then end with 0.
# The live image's PID 1 is a shell, which ignores the power-off signal a
# plain busybox `poweroff` sends it: power off directly there.
vm_stop() {
    guest 'sync; if command -v systemctl >/dev/null; then systemctl poweroff; else busybox poweroff -f; fi' \
        2>/dev/null || true
    for _ in $(seq 1 240); do
        kill -0 "$vm_pid" 2>/dev/null || break
        sleep 0.5
    done
    kill -0 "$vm_pid" 2>/dev/null && fail "imgbuild vm still runs 120 s after the power-off"
    vm_status=0
    wait "$vm_pid" || vm_status=$?
    vm_pid=
    cat "$vm_dir/vm.stdout"
    [ "$vm_status" = 0 ] || { cat "$vm_dir/vm.stderr" >&2; fail "imgbuild vm exited $vm_status after the power-off"; }
}

# console_count PATTERN: how many console lines hold PATTERN (fixed string).
console_count() { grep -acF -- "$1" "$vm_dir/console.log" 2>/dev/null || true; }
console_has() { [ "$(console_count "$2")" -ge "$1" ]; }

# wait_console SECONDS PATTERN [COUNT]: until COUNT (default 1) console lines
# hold PATTERN; the seconds it took are in console_seconds.
wait_console() {
    t_console=$(now)
    poll_guest "$1" "console line \"$2\"" console_has "${3:-1}" "$2"
    console_seconds=$(( $(now) - t_console ))
}
