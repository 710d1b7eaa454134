#!/usr/bin/env bash
# Builds an initramfs that boots Debian's kernel with Linux rxe (soft-RoCE) and rdma-core's
# stock tools, to serve as an independent RoCEv2 peer (tools/interop, docs/interop.md).
# usage: build.sh OUTDIR    (needs: linux-image-amd64, rdma-core, ibverbs-utils, perftest,
#                            busybox-static, kmod, qemu-system-x86 installed on this machine)
set -euo pipefail
out=${1:-/tmp/rxevm}
K=$(ls /lib/modules | sort -V | tail -1)
root=$(mktemp -d)
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,lib,lib64,usr/lib/x86_64-linux-gnu/libibverbs,mods,run}
cp /usr/bin/busybox "$root/bin/busybox"
for a in sh mount insmod ip ifconfig sleep cat echo poweroff mkdir ls dmesg grep sed seq timeout nc udhcpc; do ln -sf busybox "$root/bin/$a"; done
bins="/sbin/tc /usr/bin/ibv_rc_pingpong /usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/ib_write_bw /usr/bin/ib_write_lat /usr/bin/ib_send_bw /usr/bin/ib_send_lat /usr/bin/ib_read_bw /usr/bin/ib_read_lat /usr/bin/ib_atomic_bw /usr/bin/ibv_ud_pingpong /usr/bin/rdma /usr/bin/ibv_srq_pingpong"
libs=$(for b in $bins /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so; do ldd "$b" | awk '/=>/ {print $3} /ld-linux/ {print $1}'; done | sort -u)
for b in $bins; do cp "$b" "$root/bin/"; done
# Our own peer for every RC opcode (tools/rxe-vm/rc_ops.c), against the same libibverbs.
here=$(cd "$(dirname "$0")" && pwd)
gcc -O2 -Wall -o "$root/bin/rc_ops" "$here/rc_ops.c" -libverbs
for l in $libs; do mkdir -p "$root$(dirname "$l")"; cp -L "$l" "$root$l"; done
cp /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so "$root/usr/lib/x86_64-linux-gnu/libibverbs/"
mkdir -p "$root/etc/libibverbs.d"; cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
i=0
# netem both ways for the impaired round of tools/interop: egress on eth0, ingress through ifb0.
for m in virtio_pci virtio_net crc32_generic rdma_rxe sch_netem sch_ingress ifb act_mirred cls_matchall; do
  modprobe -S "$K" --show-depends "$m" | awk '{print $2}' | while read -r f; do
    n=$(basename "$f"); [ -e "$root/mods/order.$n" ] && continue
    cp "$f" "$root/mods/$n"; echo "$n" >> "$root/mods/order"; touch "$root/mods/order.$n"
  done
done
cat > "$root/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev; mkdir -p /dev/pts
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null; done
addr=$(sed -n 's/.*rxeaddr=\([^ ]*\).*/\1/p' /proc/cmdline)
ip link set lo up; ip link set eth0 up 2>/dev/null
[ -n "$addr" ] && ip addr add "$addr" dev eth0
rdma link add rxe0 type rxe netdev eth0 2>&1
echo "RXEVM-READY"
sh /cmd.sh 2>&1
echo "RXEVM-DONE rc=$?"
poweroff -f
INIT
chmod +x "$root/init"
mkdir -p "$out"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$out/initramfs.gz"
cp "/boot/vmlinuz-$K" "$out/vmlinuz"
rm -rf "$root"
echo "built $out/initramfs.gz ($(du -h "$out/initramfs.gz" | cut -f1)) for kernel $K"
