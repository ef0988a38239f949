#!/bin/sh
# Runs IN THE GUEST (ci/device: guest sh -s FILE < this): changes the first
# byte of FILE's data on the raw root partition behind the filesystem, drops
# the page cache, reads FILE, then restores the byte and reads it again.
# FILE must start with "2" (a release number).
set -eu
file=$1
dev=$(findmnt -n -o SOURCE /sysroot)
block=$(filefrag -v -b4096 "$file" | awk '$1 == "0:" { sub(/\.\.$/, "", $4); print $4 }')
[ -n "$block" ] || { echo "no first extent for $file" >&2; exit 1; }
offset=$((block * 4096))
original=$(dd if="$dev" bs=1 skip="$offset" count=1 2> /dev/null)
[ "$original" = 2 ] || { echo "$file's first byte on $dev at $offset is not 2: $original" >&2; exit 1; }
put() { printf '%s' "$1" | dd of="$dev" bs=1 seek="$offset" conv=notrunc,fsync 2> /dev/null; echo 3 > /proc/sys/vm/drop_caches; }
put X
if content=$(cat "$file" 2> /tmp/verity-flip.err); then
    echo "flipped: read back: $content"
else
    echo "flipped: read failed: $(cat /tmp/verity-flip.err)"
fi
put 2
echo "restored: $(cat "$file")"
