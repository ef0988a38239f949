#!/bin/sh
# Runs IN THE GUEST (ci/device pipes it to `sh -s`): a small container image
# of the device's own Debian binaries (cyclictest, chrt, dash and a few
# coreutils) and the shared libraries ldd names for them, imported into
# podman's local store with `podman import`: no registry is reached.
# Prints the image's ID and size.
set -eu
image=${1:-localhost/emberrtos-rt-test}
dir=$(mktemp -d /var/tmp/rt-test-image.XXXXXX)
trap 'rm -rf "$dir"' EXIT
root=$dir/root
mkdir -p "$root/proc" "$root/sys" "$root/dev" "$root/tmp" "$root/etc" "$root/usr/bin"
ln -s usr/bin "$root/bin"
# PATH NAME: the program at PATH as /usr/bin/NAME, with its libraries.
add() {
    real=$(readlink -f "$1")
    install -m 0755 "$real" "$root/usr/bin/$2"
    for lib in $(ldd "$real" | grep -o '/[^ ]*'); do
        # 0755: the kernel execs the ELF interpreter (ld.so) among them.
        [ -e "$root$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
    done
}
add /usr/bin/cyclictest cyclictest
add /usr/bin/chrt chrt
add /usr/bin/dash sh
for program in cat grep sleep true; do add "/usr/bin/$program" "$program"; done
tar -C "$root" -cf "$dir/image.tar" .
podman import --change 'CMD ["/usr/bin/sh"]' "$dir/image.tar" "$image" > /dev/null
podman image inspect --format '{{.Id}} {{.Size}}' "$image"
