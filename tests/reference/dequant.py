"""Vectorized numpy dequantizers (to float64) for the reference implementation.

Owns: block layouts of F32, F16, BF16, F64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4, and turning a gguf.Tensor into a float64
array of numpy shape reversed(ne). Products of the block scales and quants are
formed in float64, so every value is the exact real number the block encodes.
"""

import numpy as np

from gguf import GGML_TYPES, GGML_TYPE_IDS, Tensor


def _f16(b):
    """Little-endian f16 from a (..., 2) uint8 array -> float64 (...)."""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float64)


def _blocks(raw, bsz):
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size % bsz:
        raise ValueError("byte count %d is not a multiple of the block size %d" % (raw.size, bsz))
    return raw.reshape(-1, bsz)


def _u32(b):
    return np.ascontiguousarray(b).view("<u4")[..., 0].astype(np.int64)


def dq_f32(raw):
    return np.asarray(raw).view("<f4").astype(np.float64)


def dq_f64(raw):
    return np.asarray(raw).view("<f8").astype(np.float64)


def dq_f16(raw):
    return np.asarray(raw).view("<f2").astype(np.float64)


def dq_bf16(raw):
    u = np.asarray(raw).view("<u2").astype(np.uint32) << 16
    return u.view(np.float32).astype(np.float64)


def dq_q4_0(raw):
    b = _blocks(raw, 18)
    d = _f16(b[:, 0:2])
    qs = b[:, 2:18]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64) - 8.0
    return (q * d[:, None]).reshape(-1)


def dq_q4_1(raw):
    b = _blocks(raw, 20)
    d = _f16(b[:, 0:2])
    m = _f16(b[:, 2:4])
    qs = b[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
    return (q * d[:, None] + m[:, None]).reshape(-1)


def _q5_high(qh):
    """qh (nb,) int -> (nb, 32) high bits (value 0 or 16) for elements 0..31."""
    bits = (qh[:, None] >> np.arange(32)[None, :]) & 1
    return bits * 16


def dq_q5_0(raw):
    b = _blocks(raw, 22)
    d = _f16(b[:, 0:2])
    qh = _u32(b[:, 2:6])
    qs = b[:, 6:22].astype(np.int64)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | _q5_high(qh)
    return ((q - 16).astype(np.float64) * d[:, None]).reshape(-1)


def dq_q5_1(raw):
    b = _blocks(raw, 24)
    d = _f16(b[:, 0:2])
    m = _f16(b[:, 2:4])
    qh = _u32(b[:, 4:8])
    qs = b[:, 8:24].astype(np.int64)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | _q5_high(qh)
    return (q.astype(np.float64) * d[:, None] + m[:, None]).reshape(-1)


def dq_q8_0(raw):
    b = _blocks(raw, 34)
    d = _f16(b[:, 0:2])
    q = np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float64)
    return (q * d[:, None]).reshape(-1)


def _k_scale_min(sc):
    """12 packed bytes of Q4_K/Q5_K -> (scales, mins), each (nb, 8) int64 6-bit."""
    s = sc.astype(np.int64)
    scale = np.empty((s.shape[0], 8), dtype=np.int64)
    mins = np.empty((s.shape[0], 8), dtype=np.int64)
    scale[:, 0:4] = s[:, 0:4] & 63
    mins[:, 0:4] = s[:, 4:8] & 63
    scale[:, 4:8] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mins[:, 4:8] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return scale, mins


def dq_q4_k(raw):
    b = _blocks(raw, 144)
    nb = b.shape[0]
    d = _f16(b[:, 0:2])
    dmin = _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    qs = b[:, 16:144].reshape(nb, 4, 1, 32)
    q = np.empty((nb, 4, 2, 32), dtype=np.uint8)
    q[:, :, 0] = qs[:, :, 0] & 0x0F
    q[:, :, 1] = qs[:, :, 0] >> 4
    y = q.reshape(nb, 8, 32).astype(np.float64)
    y *= (d[:, None] * sc)[:, :, None]
    y -= (dmin[:, None] * mn)[:, :, None]
    return y.reshape(-1)


def dq_q5_k(raw):
    b = _blocks(raw, 176)
    nb = b.shape[0]
    d = _f16(b[:, 0:2])
    dmin = _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    qh = b[:, 16:48].astype(np.int64)  # (nb, 32)
    qs = b[:, 48:176].reshape(nb, 4, 1, 32).astype(np.int64)
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32)
    high = ((qh[:, None, :] >> np.arange(8)[None, :, None]) & 1) << 4
    q = (low | high).astype(np.float64)
    dl = (d[:, None] * sc)[:, :, None]
    ml = (dmin[:, None] * mn)[:, :, None]
    return (dl * q - ml).reshape(-1)


def dq_q6_k(raw):
    b = _blocks(raw, 210)
    nb = b.shape[0]
    ql = b[:, 0:128].reshape(nb, 2, 64)
    qh = b[:, 128:192].reshape(nb, 2, 32)
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float64)  # (nb, 16)
    d = _f16(b[:, 208:210])
    a, c = ql[:, :, 0:32], ql[:, :, 32:64]
    q = np.empty((nb, 2, 4, 32), dtype=np.uint8)
    q[:, :, 0] = (a & 0x0F) | ((qh & 3) << 4)
    q[:, :, 1] = (c & 0x0F) | (((qh >> 2) & 3) << 4)
    q[:, :, 2] = (a >> 4) | (((qh >> 4) & 3) << 4)
    q[:, :, 3] = (c >> 4) | (((qh >> 6) & 3) << 4)
    y = q.reshape(nb, 16, 16).view(np.int8) - np.int8(32)
    y = y.astype(np.float64)
    y *= (d[:, None] * sc)[:, :, None]
    return y.reshape(-1)


def dq_q2_k(raw):
    b = _blocks(raw, 84)
    nb = b.shape[0]
    sc = b[:, 0:16].astype(np.int64)
    qs = b[:, 16:80].reshape(nb, 2, 1, 32).astype(np.int64)
    d = _f16(b[:, 80:82])
    dmin = _f16(b[:, 82:84])
    q = (qs >> (2 * np.arange(4))[None, None, :, None]) & 3  # (nb, 2, 4, 32)
    q = q.reshape(nb, 16, 16).astype(np.float64)
    dl = (d[:, None] * (sc & 0x0F))[:, :, None]
    ml = (dmin[:, None] * (sc >> 4))[:, :, None]
    return (dl * q - ml).reshape(-1)


def dq_q3_k(raw):
    b = _blocks(raw, 110)
    nb = b.shape[0]
    hm = b[:, 0:32].astype(np.int64)
    qs = b[:, 32:96].reshape(nb, 2, 1, 32).astype(np.int64)
    s = b[:, 96:108].astype(np.int64)
    d = _f16(b[:, 108:110])
    k = np.arange(16)
    low4 = np.where(k < 8, s[:, k % 8] & 0x0F, s[:, k % 8] >> 4)
    high2 = (s[:, 8 + k % 4] >> (2 * (k // 4))) & 3
    scale = (low4 | (high2 << 4)) - 32  # (nb, 16)
    q = (qs >> (2 * np.arange(4))[None, None, :, None]) & 3  # (nb, 2, 4, 32)
    bit = (4 * np.arange(2)[:, None] + np.arange(4)[None, :])  # (2, 4)
    h = (hm[:, None, None, :] >> bit[None, :, :, None]) & 1
    q = (q - 4 * (1 - h)).reshape(nb, 16, 16).astype(np.float64)
    return ((d[:, None] * scale)[:, :, None] * q).reshape(-1)


_IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float64)
# FP4 (E2M1) values times 2; the block scale below is halved to match
_MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                         dtype=np.float64)


def _nibbles32(qs):
    """(nb, k, 16) bytes -> (nb, k, 32) nibble indices: low nibbles then high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def dq_iq4_nl(raw):
    b = _blocks(raw, 18)
    d = _f16(b[:, 0:2])
    q = _IQ4NL_VALUES[_nibbles32(b[:, 2:18])]
    return (q * d[:, None]).reshape(-1)


def dq_iq4_xs(raw):
    b = _blocks(raw, 136)
    nb = b.shape[0]
    d = _f16(b[:, 0:2])
    sh = (b[:, 2].astype(np.int64) | (b[:, 3].astype(np.int64) << 8))
    sl = b[:, 4:8].astype(np.int64)
    ib = np.arange(8)
    ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 0x0F) | (((sh[:, None] >> (2 * ib)) & 3) << 4)
    q = _IQ4NL_VALUES[_nibbles32(b[:, 8:136].reshape(nb, 8, 16))]  # (nb, 8, 32)
    return ((d[:, None] * (ls - 32))[:, :, None] * q).reshape(-1)


def dq_mxfp4(raw):
    b = _blocks(raw, 17)
    e = b[:, 0].astype(np.int64)
    d = np.ldexp(1.0, e - 128)
    q = _MXFP4_VALUES[_nibbles32(b[:, 1:17])]
    return (q * d[:, None]).reshape(-1)


DEQUANT = {
    "F32": dq_f32,
    "F64": dq_f64,
    "F16": dq_f16,
    "BF16": dq_bf16,
    "Q4_0": dq_q4_0,
    "Q4_1": dq_q4_1,
    "Q5_0": dq_q5_0,
    "Q5_1": dq_q5_1,
    "Q8_0": dq_q8_0,
    "Q2_K": dq_q2_k,
    "Q3_K": dq_q3_k,
    "Q4_K": dq_q4_k,
    "Q5_K": dq_q5_k,
    "Q6_K": dq_q6_k,
    "IQ4_NL": dq_iq4_nl,
    "IQ4_XS": dq_iq4_xs,
    "MXFP4": dq_mxfp4,
}


def supported(type_name):
    return type_name.upper() in DEQUANT


def dequantize_raw(raw, type_name):
    """Bytes of whole blocks of type `type_name` -> flat float64 array."""
    name = type_name.upper()
    if name not in DEQUANT:
        raise NotImplementedError("no dequantizer for %s" % type_name)
    return DEQUANT[name](np.asarray(raw, dtype=np.uint8).reshape(-1))


def dequantize(t, rows=None):
    """gguf.Tensor -> float64 array of shape reversed(ne).

    `rows`, if given, selects indices along the slowest dimension (e.g.
    token ids of an embedding matrix); only those rows are decoded.
    """
    assert isinstance(t, Tensor)
    name = t.type_name
    _, blk, bsz = GGML_TYPES[t.type]
    shape = t.shape
    if rows is None:
        return dequantize_raw(t.raw, name).reshape(shape)
    rows = np.asarray(rows, dtype=np.int64)
    row_elems = 1
    for dim in shape[1:]:
        row_elems *= dim
    row_bytes = row_elems // blk * bsz
    raw = t.raw.reshape(shape[0], row_bytes)[rows]
    return dequantize_raw(raw, name).reshape((len(rows),) + tuple(shape[1:]))


__all__ = ["dequantize", "dequantize_raw", "supported", "DEQUANT", "GGML_TYPE_IDS"]
