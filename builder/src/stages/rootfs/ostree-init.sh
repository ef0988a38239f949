#!/bin/busybox sh
# shellcheck shell=dash # busybox ash, which shellcheck checks as dash
# imgbuild boot initramfs: mounts the physical root named by root=, lets
# ostree-prepare-root set up the deployment named by ostree= at /sysroot,
# then switches to it. Built by imgbuild into /usr/lib/modules/$kver/initramfs.img.
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin:/usr/sbin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run

rescue() {
    echo "initramfs: $*" >&2
    echo "initramfs: dropping to a shell; fix the problem and exit to retry" >&2
    sh
}

root=""
rootflags="ro"
rootfstype=""
read -r cmdline < /proc/cmdline
for arg in $cmdline; do
    case "$arg" in
        root=*) root="${arg#root=}" ;;
        rootflags=*) rootflags="${arg#rootflags=}" ;;
        rootfstype=*) rootfstype="${arg#rootfstype=}" ;;
        rw) rootflags="rw" ;;
    esac
done
grep -q ' ostree=' /proc/cmdline || grep -q '^ostree=' /proc/cmdline || rescue "no ostree= on the kernel command line"
[ -n "$root" ] || rescue "no root= on the kernel command line"

# Wait up to 30 s for the root device (USB and NVMe can be slow to appear).
device=""
tries=0
while [ -z "$device" ] && [ "$tries" -lt 60 ]; do
    case "$root" in
        LABEL=*|UUID=*|PARTUUID=*|PARTLABEL=*) device="$(findfs "$root" 2>/dev/null)" ;;
        *) [ -b "$root" ] && device="$root" ;;
    esac
    [ -n "$device" ] || { sleep 0.5; tries=$((tries + 1)); }
done
[ -n "$device" ] || rescue "root device $root did not appear"

set -- -o "$rootflags"
[ -n "$rootfstype" ] && set -- "$@" -t "$rootfstype"
mount "$@" "$device" /sysroot || rescue "cannot mount $device on /sysroot"
/usr/lib/ostree/ostree-prepare-root /sysroot || rescue "ostree-prepare-root failed"

umount /proc /sys 2>/dev/null
mount --move /dev /sysroot/dev 2>/dev/null
mount --move /run /sysroot/run 2>/dev/null
exec switch_root /sysroot /sbin/init
