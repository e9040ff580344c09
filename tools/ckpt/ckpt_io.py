"""Shared helpers for the checkpoint tools: safetensors I/O, BF16 and FP8 E4M3 bit conversions.

safetensors layout (written here without the safetensors package so the byte layout is ours
and explicit): an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON
{name: {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, ...,
"__metadata__": {"format": "pt"}}, padded with spaces so the data starts 8-byte aligned, then
the tensor bytes; data_offsets are relative to the first byte after the header. A sharded
checkpoint adds model.safetensors.index.json: {"metadata": {"total_size": bytes of tensor data},
"weight_map": {tensor name: shard file name}}.
"""

import json
import os
import struct

import numpy as np

# safetensors dtype name -> numpy storage dtype. BF16 and F8_E4M3 have no numpy type: they are
# kept as their raw bits (uint16 / uint8) and converted with the helpers below.
ST_DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_, "F8_E4M3": np.uint8,
}


def f32_to_bf16_bits(x):
    """Round float32 to BF16 (round to nearest, ties to even); returns the uint16 bit patterns."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if np.any((b & 0x7F800000) == 0x7F800000):
        raise ValueError("inf/nan in weights")
    # Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the dropped
    # half is above one half ulp, or exactly one half and the kept value is odd.
    r = b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))
    return (r >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---- FP8 E4M3FN (the "fn" variant: no infinities, 0x7F/0xFF are NaN, max finite 448) ----

def _e4m3_table():
    codes = np.arange(128, dtype=np.uint32)
    e = (codes >> 3) & 0xF
    m = codes & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e.astype(np.float64) - 7))
    v[0x7F] = np.nan
    return v.astype(np.float32)


E4M3_POS = _e4m3_table()          # value of codes 0..127 (sign bit clear); [127] is NaN
E4M3_MAX = 448.0


def e4m3_to_f32(codes):
    c = np.asarray(codes, dtype=np.uint8)
    v = E4M3_POS[c & 0x7F]
    return np.where(c & 0x80, -v, v).astype(np.float32)


def f32_to_e4m3(x):
    """float32 -> E4M3FN codes, round to nearest even, saturating to +-448 (what torch's
    .to(float8_e4m3fn) gives after the clamp that every FP8 quantizer applies first)."""
    x = np.asarray(x, dtype=np.float32)
    if np.any(~np.isfinite(x)):
        raise ValueError("non-finite value for e4m3")
    a = np.minimum(np.abs(x).astype(np.float64), E4M3_MAX)
    # Quantum of the binade a falls in: 2^(e-3) for normals (e >= -6), 2^-9 for subnormals.
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.maximum(e, -6.0)
    q = np.exp2(e - 3.0)
    r = np.rint(a / q) * q            # np.rint rounds half to even; a / q is exact (power of 2)
    r = np.minimum(r, E4M3_MAX)
    # r is now exactly representable: find its code in the sorted positive table.
    code = np.searchsorted(E4M3_POS[:127].astype(np.float64), r).astype(np.uint8)
    assert np.array_equal(E4M3_POS[code].astype(np.float64), r)
    # The sign is kept on zeros too (-0.0 and negatives that round to zero give 0x80), as a
    # hardware/torch float8 conversion does.
    sign = np.signbit(x).astype(np.uint8) << 7
    return (code | sign).astype(np.uint8)


# ---- safetensors ----

def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, st_dtype, shape, ndarray holding exactly the stored bytes)."""
    header = {}
    off = 0
    for name, dt, shape, arr in tensors:
        n = arr.nbytes
        want = int(np.prod(shape, dtype=np.int64)) * np.dtype(ST_DTYPES[dt]).itemsize
        if n != want:
            raise ValueError(f"{name}: {n} bytes for {dt}{list(shape)}")
        header[name] = {"dtype": dt, "shape": [int(s) for s in shape], "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = metadata if metadata is not None else {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, _, arr in tensors:
            f.write(np.ascontiguousarray(arr).tobytes())
    return off


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return n, h


def read_safetensors(path):
    """-> {name: (st_dtype, shape, ndarray of the stored bytes, memory-mapped)}"""
    n, h = read_safetensors_header(path)
    h.pop("__metadata__", None)
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, d in h.items():
        b, e = d["data_offsets"]
        a = np.asarray(mm[b:e]).view(ST_DTYPES[d["dtype"]]).reshape(d["shape"])
        out[name] = (d["dtype"], tuple(d["shape"]), a)
    return out


def read_folder(folder):
    """All tensors of a checkpoint folder, sharded (index.json) or single-file."""
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        out = {}
        for fn in sorted(set(wm.values())):
            for k, v in read_safetensors(os.path.join(folder, fn)).items():
                if wm.get(k) != fn:
                    raise ValueError(f"{k} in {fn} but index says {wm.get(k)}")
                out[k] = v
        missing = set(wm) - set(out)
        if missing:
            raise ValueError(f"index names tensors no shard has: {sorted(missing)[:5]}")
        return out
    return read_safetensors(os.path.join(folder, "model.safetensors"))


def write_folder(folder, tensors, shards=1):
    """Write tensors (list as for write_safetensors) as model.safetensors or as `shards` files
    model-0000i-of-0000N.safetensors split at tensor boundaries into roughly equal byte sizes,
    plus model.safetensors.index.json."""
    os.makedirs(folder, exist_ok=True)
    if shards <= 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
        return
    if len(tensors) < shards:
        raise ValueError(f"{len(tensors)} tensors cannot fill {shards} shards")
    total = sum(t[3].nbytes for t in tensors)
    groups = [[] for _ in range(shards)]
    acc, i = 0, 0
    for k, t in enumerate(tensors):
        # Move on when this tensor starts past shard i's 1/shards of the bytes, or when every
        # remaining tensor is needed to give each later shard one (so there are exactly `shards`).
        target = acc * shards // max(total, 1)
        if groups[i] and i < shards - 1 and (target > i or len(tensors) - k <= shards - 1 - i):
            i += 1
        groups[i].append(t)
        acc += t[3].nbytes
    n = shards
    wm = {}
    for i, g in enumerate(groups):
        fn = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write_safetensors(os.path.join(folder, fn), g)
        for t in g:
            wm[t[0]] = fn
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
        f.write("\n")


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
