# Sourced by the VM tiers (ci/qualify, ci/device), after ci/lib/common.sh
# (fail, now): boots an image with `imgbuild vm` in the background and
# drives the guest with a real OpenSSH client. QEMU goes with imgbuild on
# every path (imgbuild kills it on SIGTERM); `vm_stop` powers the guest off
# in order.
#
# The caller sets: bin (imgbuild), key (a private key, mode 600). The EXIT
# trap kills a VM still running, then runs the caller's `on_exit` if it set
# one.
# shellcheck shell=sh

# vm_start DIR IMAGE [imgbuild vm options]: boots IMAGE under UEFI, console
# in DIR/console.log. Sets vm_pid, vm_port, vm_dir, vm_started, and keeps
# IMAGE and the options (no blanks in them) for a power cycle.
vm_start() {
    vm_dir=$1
    vm_image=$2
    shift 2
    vm_options="$*"
    mkdir -p "$vm_dir"
    vm_started=$(now)
    "${bin:?the caller sets bin}" vm "$vm_image" --uefi --console "$vm_dir/console.log" "$@" \
        > "$vm_dir/vm.stdout" 2> "$vm_dir/vm.stderr" &
    vm_pid=$!
    # shellcheck disable=SC2154 # on_exit is the caller's, and optional
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
    [ -z "${vm_port:-}" ] || guest_close
    if [ -n "${vm_pid:-}" ] && kill -0 "$vm_pid" 2>/dev/null; then
        kill -TERM "$vm_pid" 2>/dev/null || true
        wait "$vm_pid" 2>/dev/null || true
    fi
}

# guest COMMAND: runs COMMAND in the guest. The commands to one boot share
# one OpenSSH connection (a key exchange and a login cost a TCG guest about a
# second each); a reboot ends it, and the probes that wait for a guest that
# may have rebooted open a new one (guest_fresh). A connection whose guest
# went away ends after 20 s of silence, not never, and no command runs longer
# than $guest_timeout (default 900 s). The banner may take
# $guest_connect_timeout (default 30 s: a TCG guest that has just booted is
# busy, and 5 s timed out in CI); the polls for a guest that may be down
# probe with 5 s.
guest() {
    timeout "${guest_timeout:-900}" ssh -i "${key:?the caller sets key}" -p "$vm_port" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
        -o BatchMode=yes -o ConnectTimeout="${guest_connect_timeout:-30}" -o ServerAliveInterval=5 -o ServerAliveCountMax=4 \
        -o ControlMaster=auto -o ControlPath="$(guest_control_path)" -o ControlPersist=60 \
        -o LogLevel=ERROR root@127.0.0.1 "$@"
}

# guest_control_path: the shared connection's socket, one per tier and port
# (short: a socket path has at most 107 bytes).
guest_control_path() { echo "${TMPDIR:-/tmp}/imgbuild-ssh-$$-$vm_port"; }

# guest_close: ends the shared connection, if there is one.
guest_close() {
    ssh -o ControlPath="$(guest_control_path)" -O exit root@127.0.0.1 2>/dev/null || true
}

# guest_fresh COMMAND: guest, on a new connection.
guest_fresh() {
    guest_close
    guest "$@"
}

# Emulator hangs: under TCG, a warm reset now and then stops for good:
# OVMF and GRUB right after GRUB's welcome, before GRUB runs a line of its
# grub.cfg (seen once in about ten warm resets on this machine; the same disk
# boots at once from a cold start), or the reset itself, after the kernel's
# last restart message and before the firmware prints anything (seen once in
# a full CI run). That is beneath the OS under test, so the harness acts as a
# platform watchdog would: it powers the VM off and on again, on its kept
# overlay, says so, and counts it in firmware_hangs. A VM without an overlay
# cannot be powered on again: that fails.
firmware_hangs=0
firmware_hang_seconds=120

# vm_console: the whole console of this VM across power cycles.
vm_console() { cat "$vm_dir"/console.hung-*.log "$vm_dir/console.log" 2>/dev/null; }

# reset_marks: the console's last words when a warm reset is under way: the
# kernel's restart messages (a reboot, a panic's reboot) and GRUB's welcome.
reset_marks='Welcome to GRUB!|the kernel was refused by Secure Boot|Preparing to enter system sleep state S5|reboot: Restarting system|systemd-shutdown\[1\]: Rebooting\.|Rebooting in [0-9]+ seconds'

# console_last_line: the last line of the console that is not blank once
# terminal escape sequences are gone (GRUB sets colours after its welcome).
console_last_line() {
    tail -c 512 "$vm_dir/console.log" 2>/dev/null | tr -d '\r' | sed 's/\x1b\[[0-9;=?]*[A-Za-z]//g' \
        | grep -av '^[[:space:]]*$' | tail -n 1
}

# firmware_hung: the console ends in a warm reset and has been silent for
# firmware_hang_seconds.
firmware_hung() {
    console_last_line | grep -aqE "$reset_marks" || return 1
    [ $(( $(now) - $(stat -c %Y "$vm_dir/console.log") )) -ge "$firmware_hang_seconds" ]
}

power_cycle_hung_vm() {
    case " $vm_options " in *" --overlay "*) ;; *) fail "the VM hung in firmware or GRUB after a reset (console: $vm_dir/console.log) and has no overlay to power on again" ;; esac
    firmware_hangs=$(( firmware_hangs + 1 ))
    [ "$firmware_hangs" -le 3 ] || fail "a fourth hang in firmware or GRUB: not an accident; console: $vm_dir/console.log"
    echo "EMULATOR HANG $firmware_hangs: the console stopped in a warm reset ${firmware_hang_seconds} s ago, at \"$(console_last_line | cut -c 1-120)\": powering the VM off and on again" >&2
    vm_kill
    mv "$vm_dir/console.log" "$vm_dir/console.hung-$firmware_hangs.log"
    # shellcheck disable=SC2086
    vm_start "$vm_dir" "$vm_image" $vm_options
}

# poll_guest SECONDS WHAT CHECK...: runs CHECK every 2 s until it succeeds;
# fails, with the console's tail, when the VM ends or SECONDS pass first.
poll_guest() {
    limit=$1
    what=$2
    shift 2
    deadline=$(( $(now) + limit ))
    until "$@"; do
        if firmware_hung; then
            power_cycle_hung_vm
        fi
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

ssh_answers() { guest_connect_timeout=5 guest_fresh true 2>/dev/null; }

# wait_ssh SECONDS: until the guest answers over SSH; the seconds since
# vm_start are in ssh_seconds.
wait_ssh() {
    poll_guest "$1" "SSH" ssh_answers
    # shellcheck disable=SC2034 # for the caller
    ssh_seconds=$(( $(now) - vm_started ))
}

# boot_id: the guest's boot id, or nothing within 15 s (a poll never stalls
# on a connection the rebooting guest left half-open).
boot_id() {
    guest_timeout=15
    guest_connect_timeout=5 guest_fresh cat /proc/sys/kernel/random/boot_id
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
    # shellcheck disable=SC2034 # for the caller
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
    guest_close
    vm_status=0
    wait "$vm_pid" || vm_status=$?
    vm_pid=
    cat "$vm_dir/vm.stdout"
    [ "$vm_status" = 0 ] || { cat "$vm_dir/vm.stderr" >&2; fail "imgbuild vm exited $vm_status after the power-off"; }
}

# console_count PATTERN: how many console lines hold PATTERN (fixed string).
console_count() { vm_console | grep -acF -- "$1" || true; }
console_has() { [ "$(console_count "$2")" -ge "$1" ]; }

# wait_console SECONDS PATTERN [COUNT]: until COUNT (default 1) console lines
# hold PATTERN; the seconds it took are in console_seconds.
wait_console() {
    t_console=$(now)
    poll_guest "$1" "console line \"$2\"" console_has "${3:-1}" "$2"
    # shellcheck disable=SC2034 # for the caller
    console_seconds=$(( $(now) - t_console ))
}
