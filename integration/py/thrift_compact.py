"""The Thrift compact protocol, enough to edit a Parquet footer or page index in place: a
struct is a list of [field id, type, value], read by R and written back by W.

Used by hostile.py to forge footers whose claims a reader must not follow.
"""

import struct
T_TRUE, T_FALSE, T_BYTE, T_I16, T_I32, T_I64, T_DOUBLE, T_BIN, T_LIST, T_SET, T_MAP, T_STRUCT = 1,2,3,4,5,6,7,8,9,10,11,12
class R:
    def __init__(s, b, at=0): s.b = b; s.at = at
    def byte(s): v = s.b[s.at]; s.at += 1; return v
    def varint(s):
        v = 0; sh = 0
        while True:
            x = s.byte(); v |= (x & 0x7f) << sh; sh += 7
            if not x & 0x80: return v
    def zz(s): v = s.varint(); return (v >> 1) ^ -(v & 1)
    def val(s, t):
        if t in (T_TRUE, T_FALSE): return t == T_TRUE
        if t == T_BYTE: return s.byte()
        if t in (T_I16, T_I32, T_I64): return s.zz()
        if t == T_DOUBLE: v = s.b[s.at:s.at+8]; s.at += 8; return v
        if t == T_BIN: n = s.varint(); v = s.b[s.at:s.at+n]; s.at += n; return bytes(v)
        if t in (T_LIST, T_SET):
            h = s.byte(); n = h >> 4; et = h & 15
            if n == 15: n = s.varint()
            items = []
            for _ in range(n):
                if et in (T_TRUE, T_FALSE): items.append(s.byte() == 1)
                else: items.append(s.val(et))
            return (et, items)
        if t == T_MAP:
            n = s.varint()
            if n == 0: return (0, 0, [])
            kv = s.byte(); return (kv >> 4, kv & 15, [(s.val(kv >> 4), s.val(kv & 15)) for _ in range(n)])
        if t == T_STRUCT: return s.struct()
        raise ValueError(f"type {t}")
    def struct(s):
        out = []; last = 0
        while True:
            h = s.byte()
            if h == 0: return out
            d, t = h >> 4, h & 15
            fid = last + d if d else s.zz()
            last = fid
            out.append([fid, t, s.val(t)])
class W:
    def __init__(s): s.b = bytearray()
    def varint(s, v):
        while True:
            x = v & 0x7f; v >>= 7
            if v: s.b.append(x | 0x80)
            else: s.b.append(x); return
    def zz(s, v): s.varint((v << 1) ^ (v >> 63))
    def val(s, t, v):
        if t in (T_I16, T_I32, T_I64): s.zz(v)
        elif t == T_BYTE: s.b.append(v & 0xff)
        elif t == T_DOUBLE: s.b += v
        elif t == T_BIN: s.varint(len(v)); s.b += v
        elif t in (T_LIST, T_SET):
            et, items = v[0], v[1]; n = v[2] if len(v) > 2 else len(items)
            if n < 15: s.b.append((n << 4) | et)
            else: s.b.append(0xF0 | et); s.varint(n)
            for it in items:
                if et in (T_TRUE, T_FALSE): s.b.append(1 if it else 2)
                else: s.val(et, it)
        elif t == T_MAP:
            kt, vt, items = v
            s.varint(len(items))
            if items: s.b.append((kt << 4) | vt)
            for k, x in items: s.val(kt, k); s.val(vt, x)
        elif t == T_STRUCT: s.struct(v)
        elif t in (T_TRUE, T_FALSE): pass
    def struct(s, fields):
        last = 0
        for fid, t, v in fields:
            if t in (T_TRUE, T_FALSE): t = T_TRUE if v else T_FALSE
            d = fid - last
            if 0 < d <= 15: s.b.append((d << 4) | t)
            else: s.b.append(t); s.zz(fid)
            last = fid
            s.val(t, v)
        s.b.append(0)
def get(st, fid):
    for f in st:
        if f[0] == fid: return f
    return None
def read_footer(path):
    b = open(path, "rb").read()
    n = struct.unpack("<I", b[-8:-4])[0]
    start = len(b) - 8 - n
    return b[:start], R(b, start).struct()
def write_with_footer(path, body, fm):
    w = W(); w.struct(fm); f = bytes(w.b)
    open(path, "wb").write(body + f + struct.pack("<I", len(f)) + b"PAR1")


def write_struct(fields):
    w = W()
    w.struct(fields)
    return bytes(w.b)
