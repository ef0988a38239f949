# The helpers the CI tiers share, one copy each. Sourced (POSIX sh) by
# every tier after it has cd'ed to the checkout's root:
#   tier=NAME   # the tier's name in `fail` and `step` lines
#   . ci/lib/common.sh
# Sourcing defines functions and sets `started`; it runs nothing else.
# Helpers that need variables of their own run in a subshell, so that they
# never change a variable of the tier.
# shellcheck shell=sh

# started: when the tier began (sourcing common.sh), date +%s; step counts
# from it.
started=$(date +%s)

# fail MESSAGE: says "TIER FAILED: MESSAGE" on stderr and exits 1.
fail() { echo "${tier:-ci} FAILED: $*" >&2; exit 1; }

# step TEXT: a heading with the seconds since the tier began, to read a
# slow CI log by.
step() { echo; echo "=== ${tier:-ci} [+$(( $(now) - started ))s]: $* ==="; }

# now: wall time in whole seconds (date +%s).
now() { date +%s; }
# clock: wall time in seconds with nanoseconds (date +%s.%N), for since.
clock() { date +%s.%N; }
# since START [DECIMALS]: the seconds from START (a clock reading) to now,
# with DECIMALS (default 1) decimals.
since() { awk -v start="$1" -v end="$(clock)" -v decimals="${2:-1}" 'BEGIN { printf("%." decimals "f\n", end - start) }'; }
# ratio A B: A / B with 3 decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf("%.3f\n", a / b) }'; }

# free_port: a TCP port on 127.0.0.1 that nothing listens on now.
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# entries DIR [GLOB]: the names in DIR that match GLOB (default *), one a
# line, sorted, no dot files (what `ls DIR` lists); nothing when DIR is
# missing.
entries() (
    CDPATH="" cd -- "$1" 2> /dev/null || exit 0
    # The pattern is expanded on purpose: it is a glob.
    # shellcheck disable=SC2086
    for name in ${2:-*}; do
        if [ -e "$name" ] || [ -L "$name" ]; then echo "$name"; fi
    done
)

# JSON, read with Debian's Python (a python3 earlier on PATH may be another)
# and no eval: a value is reached by a path of keys.
#
# json_get [--default TEXT] FILE KEY...: the value at KEY... in the JSON
# document FILE. Each KEY is, on an object, a member's name; on an array, an
# index (0, 1, -1 for the last); and, on an array or on an object's values,
# FIELD=VALUE: the array of the elements whose FIELD is VALUE (a string
# equal to VALUE, or another value whose JSON text is VALUE), to index next:
#   json_get out.json stages stage=iso 0 output iso
# Prints a string as it is and any other value as JSON. A path that leads
# nowhere fails, naming the path, unless --default gives the text to print.
json_get() {
    /usr/bin/python3 -c '
import json, sys
args = sys.argv[1:]
default = None
if args[:1] == ["--default"]:
    default, args = args[1], args[2:]
path, keys = args[0], args[1:]
with open(path) as f:
    node = json.load(f)
try:
    for key in keys:
        field, is_filter, value = key.partition("=")
        if is_filter and isinstance(node, (list, dict)):
            items = node.values() if isinstance(node, dict) else node
            node = [e for e in items if isinstance(e, dict) and field in e
                    and (e[field] == value if isinstance(e[field], str) else json.dumps(e[field]) == value)]
        elif isinstance(node, list):
            node = node[int(key)]
        elif isinstance(node, dict):
            node = node[key]
        else:
            raise KeyError(key)
except (KeyError, IndexError, ValueError):
    if default is None:
        sys.exit("json_get: %s has no %s" % (path, " ".join(keys)))
    node = default
print(node if isinstance(node, str) else json.dumps(node))
' "$@"
}

# json_valid FILE: whether FILE holds one JSON document.
json_valid() { /usr/bin/python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$1" 2> /dev/null; }

# stage_output FILE STAGE KEY...: KEY... of the output of STAGE in FILE, what
# `imgbuild --json recipe` printed.
stage_output() (
    file=$1 stage=$2
    shift 2
    json_get "$file" stages "stage=$stage" 0 output "$@"
)

# stages_run FILE: the stages of that run that did not come from the cache,
# comma-separated (nothing when every stage did).
stages_run() {
    /usr/bin/python3 -c 'import json, sys; print(",".join(s["stage"] for s in json.load(open(sys.argv[1]))["stages"] if s["outcome"] != "cached"))' "$1"
}

# kill_gpg_agent: stops the gpg-agent of $GNUPGHOME, if one runs.
kill_gpg_agent() { gpgconf --kill gpg-agent 2> /dev/null || true; }

# image_uts BZIMAGE: the kernel's `uname -v`, read from the image's own
# version string (the setup header's pointer, boot protocol 2.00+), not by
# imgbuild.
image_uts() {
    /usr/bin/python3 -c 'import sys
d = open(sys.argv[1], "rb").read()
at = int.from_bytes(d[0x20e:0x210], "little") + 0x200
print(d[at:d.index(b"\0", at)].decode().split(") ", 1)[1])' "$1"
}
