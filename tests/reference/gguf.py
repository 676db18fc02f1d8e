"""GGUF v2/v3 reader for the reference implementation.

Owns: parsing of the GGUF header, all metadata value types (including nested
arrays), tensor infos and data alignment. `GGUFFile(path)` maps the file with
np.memmap and exposes `metadata` (dict key -> Python value; arrays become
lists, nested arrays lists of lists) and `tensors` (dict name -> Tensor whose
`raw` is a uint8 view on the memmap).

GGUF's ne[0] is the fastest-varying dimension, so a tensor with
ne = [n0, n1, n2] has the numpy shape (n2, n1, n0); `Tensor.shape` is that
numpy shape and `Tensor.ne` the GGUF order.
"""

import struct

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# metadata value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32 = range(7)
T_BOOL, T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(7, 13)

_SCALAR_FMT = {
    T_UINT8: ("<B", np.uint8),
    T_INT8: ("<b", np.int8),
    T_UINT16: ("<H", np.uint16),
    T_INT16: ("<h", np.int16),
    T_UINT32: ("<I", np.uint32),
    T_INT32: ("<i", np.int32),
    T_FLOAT32: ("<f", np.float32),
    T_BOOL: ("<?", np.bool_),
    T_UINT64: ("<Q", np.uint64),
    T_INT64: ("<q", np.int64),
    T_FLOAT64: ("<d", np.float64),
}

# ggml tensor types: id -> (name, elements per block, bytes per block)
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
GGML_TYPE_IDS = {v[0]: k for k, v in GGML_TYPES.items()}


class GGUFError(ValueError):
    pass


class Tensor:
    """One tensor of a GGUF file: name, GGUF ne, ggml type, bytes."""

    def __init__(self, name, ne, ggml_type, offset, raw):
        self.name = name
        self.ne = tuple(int(n) for n in ne)
        self.type = int(ggml_type)
        self.offset = int(offset)  # relative to the data section
        self.raw = raw  # np.uint8 view on the memmap

    @property
    def type_name(self):
        return GGML_TYPES[self.type][0]

    @property
    def shape(self):
        return tuple(reversed(self.ne))

    @property
    def n_elements(self):
        n = 1
        for d in self.ne:
            n *= d
        return n

    _PLAIN = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2",
              "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}

    def view(self):
        """Zero-copy numpy view in numpy shape for plain types (BF16 as uint16);
        for block-quantized types the raw blocks, shape (..., bytes per row)."""
        name = self.type_name
        if name in self._PLAIN:
            return self.raw.view(self._PLAIN[name]).reshape(self.shape)
        _, blk, bsz = GGML_TYPES[self.type]
        return self.raw.reshape(self.shape[:-1] + (self.ne[0] // blk * bsz,))

    def __repr__(self):
        return "Tensor(%r, ne=%r, %s)" % (self.name, self.ne, self.type_name)


def tensor_nbytes(ne, ggml_type):
    if ggml_type not in GGML_TYPES:
        raise GGUFError("unknown ggml type %d" % ggml_type)
    _, blk, bsz = GGML_TYPES[ggml_type]
    if ne and ne[0] % blk:
        raise GGUFError("ne[0]=%d is not a multiple of the block size %d" % (ne[0], blk))
    n = 1
    for d in ne:
        n *= d
    return n // blk * bsz


class _Cursor:
    def __init__(self, buf, size):
        self.buf = buf
        self.size = size
        self.pos = 0

    def need(self, n):
        if n < 0 or self.pos + n > self.size:
            raise GGUFError("truncated file at offset %d (need %d bytes)" % (self.pos, n))

    def unpack(self, fmt):
        n = struct.calcsize(fmt)
        self.need(n)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.unpack("<Q")
        self.need(n)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s.decode("utf-8", errors="surrogateescape")

    def strings(self, count):
        unpack = struct.Struct("<Q").unpack_from
        buf, size, pos = self.buf, self.size, self.pos
        out = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8)
            n = unpack(buf, pos)[0]
            pos += 8
            if pos + n > size:
                self.pos = pos
                self.need(n)
            append(str(buf[pos:pos + n], "utf-8", "surrogateescape"))
            pos += n
        self.pos = pos
        return out

    def array_np(self, dtype, count):
        nbytes = np.dtype(dtype).itemsize * count
        self.need(nbytes)
        a = np.frombuffer(self.buf, dtype=np.dtype(dtype).newbyteorder("<"),
                          count=count, offset=self.pos)
        self.pos += nbytes
        return a

    def value(self, typ, depth=0):
        if typ in _SCALAR_FMT:
            v = self.unpack(_SCALAR_FMT[typ][0])
            if typ == T_BOOL:
                return bool(v)
            return v
        if typ == T_STRING:
            return self.string()
        if typ == T_ARRAY:
            if depth > 64:
                raise GGUFError("arrays nested too deeply")
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in _SCALAR_FMT:
                a = self.array_np(_SCALAR_FMT[etype][1], count)
                if etype == T_BOOL:
                    return [bool(x) for x in a]
                return a.tolist()
            if etype == T_STRING:
                return self.strings(count)
            if etype == T_ARRAY:
                return [self.value(T_ARRAY, depth + 1) for _ in range(count)]
            raise GGUFError("unknown array element type %d" % etype)
        raise GGUFError("unknown metadata value type %d" % typ)


class GGUFFile:
    """A mapped GGUF file: .version, .metadata, .tensors, .alignment, .data_offset."""

    def __init__(self, path):
        self.path = path
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        buf = memoryview(self.mm)
        c = _Cursor(buf, len(self.mm))
        c.need(4)
        if bytes(buf[0:4]) != GGUF_MAGIC:
            raise GGUFError("not a GGUF file (bad magic)")
        c.pos = 4
        self.version = c.unpack("<I")
        if self.version not in (2, 3) and self.version & 0xFFFF == 0 and (self.version >> 24) in (2, 3):
            raise GGUFError("big-endian GGUF files are not supported")
        if self.version not in (2, 3):
            raise GGUFError("unsupported GGUF version %d" % self.version)
        n_tensors = c.unpack("<Q")
        n_kv = c.unpack("<Q")
        self.metadata = {}
        self.metadata_types = {}
        for _ in range(n_kv):
            key = c.string()
            typ = c.unpack("<I")
            if key in self.metadata:
                raise GGUFError("duplicate metadata key %r" % key)
            self.metadata[key] = c.value(typ)
            self.metadata_types[key] = typ
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.unpack("<I")
            if n_dims > 4:
                raise GGUFError("tensor %r has %d dims" % (name, n_dims))
            ne = [c.unpack("<Q") for _ in range(n_dims)]
            ggml_type = c.unpack("<I")
            offset = c.unpack("<Q")
            infos.append((name, ne, ggml_type, offset))
        self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError("bad alignment %d" % self.alignment)
        a = self.alignment
        self.data_offset = (c.pos + a - 1) // a * a
        self.tensors = {}
        for name, ne, ggml_type, offset in infos:
            if name in self.tensors:
                raise GGUFError("duplicate tensor %r" % name)
            if offset % a:
                raise GGUFError("tensor %r offset %d not aligned" % (name, offset))
            nbytes = tensor_nbytes(ne, ggml_type)
            start = self.data_offset + offset
            if start + nbytes > len(self.mm):
                raise GGUFError("tensor %r runs past the end of the file" % name)
            raw = self.mm[start:start + nbytes]
            self.tensors[name] = Tensor(name, ne, ggml_type, offset, raw)

    def get(self, key, default=None):
        return self.metadata.get(key, default)

    @property
    def architecture(self):
        return self.metadata.get("general.architecture")


def load(path):
    return GGUFFile(path)
