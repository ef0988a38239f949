# Sourced by the CI tiers, after ci/lib/common.sh (fail, free_port): static
# HTTP servers on 127.0.0.1 (Debian's `python3 -m http.server`), each killed
# by stop_servers. The caller calls stop_servers on exit.
# shellcheck shell=sh

servers=

# serve DIR PORT LOG: serves DIR on 127.0.0.1:PORT; returns once it answers.
serve() {
    mkdir -p "$1"
    /usr/bin/python3 -m http.server "$2" --bind 127.0.0.1 --directory "$1" > "$3" 2>&1 &
    servers="$servers $!"
    for _ in $(seq 100); do
        if /usr/bin/python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "http://127.0.0.1:$2/" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    fail "http.server on $2 did not answer: $(cat "$3")"
}

stop_servers() {
    for pid in $servers; do kill "$pid" 2>/dev/null || true; done
    servers=
}
