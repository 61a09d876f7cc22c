#!/usr/bin/env bash
# Installs what running the aarch64 wheel on this x86_64 machine needs (aarch64, docs/platforms.md), and is quick
# when all is already there. Used by scripts/test.sh and scripts/test-aarch64.sh before
# tests/aarch64.
#
#  - qemu-system-arm: `qemu-system-aarch64`, the emulated arm64 machine the smoke test boots
#    with Debian's arm64 kernel. A whole machine rather than qemu-user, because qemu-user
#    answers seccomp(2) and Landlock's calls with ENOSYS and its own thread bars a user
#    namespace, so no confinement layer could be shown on under it.
#  - qemu-user-static, registered with binfmt_misc for aarch64 ELF files with the F flag (the
#    interpreter is opened once, so it works inside another root): debootstrap's second stage
#    runs the arm64 root's package scripts through it. The registration is the kernel's, for
#    the whole machine, until it reboots.
#  - cpio: the guest's initramfs; kmod: depmod, for the index of the guest's kernel modules;
#    debootstrap: the arm64 root.
#
#   scripts/setup-emulation.sh
set -euo pipefail

SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
need_apt=()
command -v qemu-system-aarch64 >/dev/null || need_apt+=(qemu-system-arm)
conf=/usr/lib/binfmt.d/qemu-aarch64.conf
[ -f "$conf" ] || need_apt+=(qemu-user-static)
command -v cpio >/dev/null || need_apt+=(cpio)
command -v depmod >/dev/null || [ -x /usr/sbin/depmod ] || need_apt+=(kmod)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup-emulation: installing ${need_apt[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${need_apt[@]}" >/dev/null
fi

binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/qemu-aarch64" ]; then
  [ -e "$binfmt/register" ] || $SUDO mount -t binfmt_misc binfmt_misc "$binfmt"
  # Debian's own line (magic, mask, interpreter, flags), as systemd-binfmt would register it.
  echo "setup-emulation: registering aarch64 ELF files with binfmt_misc ($conf)" >&2
  $SUDO sh -c "cat '$conf' > '$binfmt/register'"
fi
grep -qx enabled "$binfmt/qemu-aarch64" || { echo "setup-emulation: qemu-aarch64 binfmt is disabled" >&2; exit 1; }
