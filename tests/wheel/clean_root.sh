#!/bin/sh
# clean_root.sh ROOT WORK COMMAND...: runs COMMAND with ROOT (a bare Debian made by debootstrap)
# as its root file system, in a mount namespace of its own: /proc, /dev and /sys of the host,
# a fresh /tmp, and WORK at /mnt; nothing else of the host is reachable. It uses pivot_root, not
# chroot, because the kernel refuses a new user namespace to a chrooted process
# (user_namespaces(7)) and the sandbox worker makes one. Needs root.
set -eu
root=$1 work=$2
shift 2
exec unshare --mount --propagation private -- /bin/sh -eu -c '
root=$1 work=$2
shift 2
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
mount -t tmpfs tmpfs "$root/tmp"
mount --bind "$work" "$root/mnt"
cd "$root"
mkdir -p .host
pivot_root . .host
umount -l /.host
exec env -i HOME=/mnt/home LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
' clean-root "$root" "$work" "$@"
