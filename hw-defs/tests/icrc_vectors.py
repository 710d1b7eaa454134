#!/usr/bin/env python3
"""Derives the ICRC golden vectors in icrc_golden.rs, independently of the Rust code.

Each datagram is packed by hand with `struct`, the fields rxe masks are set to ones in a copy
(IPv4 TOS, TTL, header checksum; IPv6 traffic class, flow label, hop limit; UDP checksum; BTH
byte 4), and the ICRC is zlib's CRC-32 over eight 0xff bytes (the LRH stand-in) followed by the
masked copy up to the ICRC, stored little-endian. Run it with `python3 icrc_vectors.py`; it
prints the vectors as Rust arrays.
"""
import ipaddress
import struct
import zlib


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def bth(opcode, se, mig, pad, pkey, fecn, becn, qpn, ackreq, psn):
    flags = (se << 7) | (mig << 6) | (pad << 4)
    cong = (fecn << 7) | (becn << 6)
    return struct.pack("!BBHB", opcode, flags, pkey, cong) + qpn.to_bytes(3, "big") + \
        bytes([ackreq << 7]) + psn.to_bytes(3, "big")


def icrc(ip_hdr, udp_hdr, ib_without_icrc, v6):
    ip = bytearray(ip_hdr)
    if v6:
        ip[0] |= 0x0F
        ip[1:4] = b"\xff\xff\xff"
        ip[7] = 0xFF
    else:
        ip[1] = 0xFF
        ip[8] = 0xFF
        ip[10:12] = b"\xff\xff"
    udp = bytearray(udp_hdr)
    udp[6:8] = b"\xff\xff"
    ib = bytearray(ib_without_icrc)
    ib[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(ib)) & 0xFFFFFFFF


def v4_datagram(src, dst, tos, ident, df, ttl, sport, ib, udp_check=0):
    udp_len = 8 + len(ib) + 4
    total = 20 + udp_len
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, tos, total, ident, 0x4000 if df else 0, ttl, 17, 0,
                      ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed)
    hdr = hdr[:10] + struct.pack("!H", ~csum(hdr) & 0xFFFF) + hdr[12:]
    udp = struct.pack("!HHHH", sport, 4791, udp_len, udp_check)
    crc = icrc(hdr, udp, ib, v6=False)
    return hdr + udp + ib + struct.pack("<I", crc), crc


def v6_datagram(src, dst, tclass, flow, hop, sport, ib):
    udp_len = 8 + len(ib) + 4
    s, d = ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed
    hdr = struct.pack("!IHBB", (6 << 28) | (tclass << 20) | flow, udp_len, 17, hop) + s + d
    udp = struct.pack("!HHHH", sport, 4791, udp_len, 0)
    crc = icrc(hdr, udp, ib, v6=True)
    body = udp + ib + struct.pack("<I", crc)
    pseudo = s + d + struct.pack("!IxxxB", udp_len, 17)
    check = ~csum(pseudo + body) & 0xFFFF or 0xFFFF
    body = body[:6] + struct.pack("!H", check) + body[8:]
    return hdr + body, crc


def vectors():
    # 1. IPv4 RDMA WRITE Only: 7 payload bytes, pad 1, BECN set (masked by the ICRC).
    payload = b"RoCEv2!"
    ib = bth(0x0A, 0, 0, 1, 0xFFFF, 0, 1, 0x000011, 1, 0x123456) + \
        struct.pack("!QII", 0x00007F0000001000, 0x1234, len(payload)) + payload + b"\0"
    yield "IPV4_WRITE_ONLY", v4_datagram("198.18.0.1", "198.18.0.2", 0x02, 0, True, 64, 0xC5E3, ib)

    # 2. IPv6 SEND Only with Immediate: solicited, 8 payload bytes, PSN 0xffffff.
    ib = bth(0x05, 1, 0, 0, 0xFFFF, 0, 0, 0xABCDEF, 1, 0xFFFFFF) + \
        struct.pack("!I", 0xDEADBEEF) + bytes(range(8))
    yield "IPV6_SEND_ONLY_IMM", v6_datagram("2001:db8::1", "2001:db8::2", 0x28, 0xABCDE, 64,
                                           0xD00D, ib)

    # 3. IPv4 Acknowledge with a UDP checksum, FECN, TTL 1 and TOS 0xb8: all masked, so the
    #    ICRC is the one a sender with checksum 0, TTL 64 and TOS 0 computes.
    ib = bth(0x11, 0, 0, 0, 0xFFFF, 1, 0, 0x000022, 0, 0x000100) + struct.pack("!I", 0x1F000102)
    yield "IPV4_ACK_MASKED", v4_datagram("198.18.0.2", "198.18.0.1", 0xB8, 0, True, 1, 0xC001,
                                         ib, udp_check=0xBEEF)


def connectx_cnp():
    """A CNP captured on a ConnectX-4 Lx (published in scapy's test/contrib/roce.uts): the
    hardware's own ICRC bytes, which this derivation must reproduce."""
    frame = bytes.fromhex(
        "e41d2dab2bc27cfe90643b320800"  # Ethernet
        "45c2003c718c4000401191610a0011010a001201"  # IPv4
        "000012b700280000"  # UDP
        "8100ffff4000011800000000"  # BTH: CNP, BECN, QP 0x118
        + "00" * 16  # CNP padding
        + "82fd002a")  # ICRC
    datagram = frame[14:]
    crc = icrc(datagram[:20], datagram[20:28], datagram[28:-4], v6=False)
    assert struct.pack("<I", crc) == datagram[-4:], "derivation disagrees with the hardware"
    return datagram, crc


def rust_array(name, data):
    lines = []
    for i in range(0, len(data), 12):
        lines.append("    " + " ".join("0x%02x," % b for b in data[i:i + 12]))
    return "const %s: [u8; %d] = [\n%s\n];" % (name, len(data), "\n".join(lines))


if __name__ == "__main__":
    for name, (datagram, crc) in list(vectors()) + [("CONNECTX4_LX_CNP", connectx_cnp())]:
        print("/// ICRC 0x%08x, stored as %s." % (crc, " ".join("%02x" % b for b in
                                                            struct.pack("<I", crc))))
        print(rust_array(name, datagram))
        print()
