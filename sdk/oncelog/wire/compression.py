"""The compression codecs of a record batch (attributes bits 0-2), as Kafka
writes and reads them.

A compressed batch keeps its 61-byte header as it is and compresses the
records part (everything after the header) as one block; `record_count`
still counts the records inside. The codecs and their ids are Kafka's:

    id  name     format
     0  none
     1  gzip     a gzip member (RFC 1952), zlib from the standard library
     2  snappy   written in the xerial framing that Kafka's Java client
                 writes (magic b"\\x82SNAPPY\\x00", version 1, compat 1, then
                 (int32 length, raw snappy block) per 32 KiB of input); read
                 framed or raw (librdkafka writes raw snappy)
     3  lz4      the LZ4 *frame* format (not a bare block), independent
                 blocks: Kafka's Java reader refuses linked blocks
     4  zstd     a zstd frame

Levels are Kafka's defaults: gzip 6 (zlib's default), lz4 9, zstd 3.
Ids 5-7 are not codecs: readers refuse them (`UnknownCodecError`).

Decompression is bounded: a batch whose records would exceed
`max_bytes` once decompressed is refused (a few compressed bytes can
stand for gigabytes). gzip and snappy stop at the bound; lz4 and zstd
check the size the frame declares when it declares one, and the size they
produced otherwise.
"""

from __future__ import annotations

import enum
import struct
import zlib

import cramjam

ATTR_COMPRESSION_MASK = 0x07


class Codec(enum.IntEnum):
    """A batch's compression codec: the id in attributes bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


# Kafka's compression.type names, as producers take them.
CODEC_NAMES: dict[str, Codec] = {codec.name.lower(): codec for codec in Codec}

GZIP_LEVEL = 6
LZ4_LEVEL = 9
ZSTD_LEVEL = 3
# The xerial framing: its magic, then version 1 and oldest compatible version 1.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK_BYTES = 32 * 1024
_I32 = struct.Struct(">i")
_LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"
_ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"


class CompressionError(ValueError):
    """Compressed records that do not decompress; the message says why."""


class UnknownCodecError(CompressionError):
    """Attributes name a codec id that is none of Kafka's (5-7)."""


def codec_of(attributes: int) -> Codec:
    """The codec named by a batch's attributes; UnknownCodecError for 5-7."""
    codec_id = attributes & ATTR_COMPRESSION_MASK
    if codec_id > Codec.ZSTD:
        raise UnknownCodecError(
            f"record batch compression codec is {codec_id} (attributes {attributes:#06x}); "
            "expected 0 none, 1 gzip, 2 snappy, 3 lz4 or 4 zstd"
        )
    return Codec(codec_id)


def compress(codec: Codec, data: bytes) -> bytes:
    """The records part `data` compressed with `codec` (NONE returns it)."""
    if codec is Codec.NONE:
        return data
    if codec is Codec.GZIP:
        # A gzip member with mtime 0, so the same records give the same bytes.
        return _gzip(data)
    if codec is Codec.SNAPPY:
        return _xerial_snappy(data)
    if codec is Codec.LZ4:
        return _lz4_frame(data)
    return bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL))


def decompress(codec: Codec, data: bytes | memoryview, *, max_bytes: int) -> bytes:
    """The records part of a batch compressed with `codec`, at most
    `max_bytes` long; CompressionError when it does not decompress or is
    longer."""
    if codec is Codec.NONE:
        return bytes(data)
    try:
        if codec is Codec.GZIP:
            out = _gunzip(data, max_bytes)
        elif codec is Codec.SNAPPY:
            out = _unsnappy(data, max_bytes)
        elif codec is Codec.LZ4:
            _check_declared(_lz4_content_size(data), max_bytes, codec)
            out = bytes(cramjam.lz4.decompress(data))
        else:
            _check_declared(_zstd_content_size(data), max_bytes, codec)
            out = bytes(cramjam.zstd.decompress(data))
    except CompressionError:
        raise
    except Exception as exc:  # each library raises its own kinds
        raise CompressionError(
            f"{codec.name.lower()} records do not decompress: {exc}"
        ) from None
    if len(out) > max_bytes:
        raise CompressionError(_too_long(codec, len(out), max_bytes))
    return out


def _too_long(codec: Codec, size: int, max_bytes: int) -> str:
    return (
        f"{codec.name.lower()} records decompress to {size} bytes, over the limit "
        f"of {max_bytes}"
    )


def _check_declared(size: int | None, max_bytes: int, codec: Codec) -> None:
    if size is not None and size > max_bytes:
        raise CompressionError(_too_long(codec, size, max_bytes))


def _gzip(data: bytes) -> bytes:
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def _gunzip(data: bytes | memoryview, max_bytes: int) -> bytes:
    # 32 + MAX_WBITS would also take a zlib stream; Kafka writes gzip only.
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = decompressor.decompress(data, max_bytes + 1)
    if len(out) > max_bytes:
        raise CompressionError(_too_long(Codec.GZIP, len(out), max_bytes))
    if not decompressor.eof:
        raise CompressionError("gzip records end before their gzip stream does")
    # Several gzip members may follow each other (as `gzip -c a b` writes).
    rest = decompressor.unused_data
    if rest:
        return out + _gunzip(rest, max_bytes - len(out))
    return out


def _xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 of fewer than 16 bytes (all an LZ4 frame descriptor needs)."""
    if len(data) >= 16:
        raise ValueError("_xxh32 hashes fewer than 16 bytes")
    mask = 0xFFFFFFFF
    h = (seed + _XXH_PRIME5 + len(data)) & mask
    pos = 0
    while pos + 4 <= len(data):
        (word,) = struct.unpack_from("<I", data, pos)
        h = (h + word * _XXH_PRIME3) & mask
        h = (((h << 17) | (h >> 15)) & mask) * _XXH_PRIME4 & mask
        pos += 4
    for byte in data[pos:]:
        h = (h + byte * _XXH_PRIME5) & mask
        h = (((h << 11) | (h >> 21)) & mask) * _XXH_PRIME1 & mask
    h ^= h >> 15
    h = h * _XXH_PRIME2 & mask
    h ^= h >> 13
    h = h * _XXH_PRIME3 & mask
    h ^= h >> 16
    return h


_XXH_PRIME1 = 2654435761
_XXH_PRIME2 = 2246822519
_XXH_PRIME3 = 3266489917
_XXH_PRIME4 = 668265263
_XXH_PRIME5 = 374761393
# The LZ4 frame this codec writes: FLG version 1 with independent blocks
# (Kafka's Java reader refuses linked ones), no block or content checksums
# and no content size; BD 64 KiB blocks; then the descriptor's checksum
# byte (its XXH32, second byte).
_LZ4_BLOCK_BYTES = 64 * 1024
_LZ4_DESCRIPTOR = bytes((0x60, 0x40))
_LZ4_FRAME_HEADER = (_LZ4_FRAME_MAGIC + _LZ4_DESCRIPTOR
                     + bytes(((_xxh32(_LZ4_DESCRIPTOR) >> 8) & 0xFF,)))
_LZ4_END_MARK = b"\x00\x00\x00\x00"
_LZ4_UNCOMPRESSED = 0x80000000
_U32_LE = struct.Struct("<I")


def _lz4_frame(data: bytes) -> bytes:
    """`data` as an LZ4 frame, compressed a 64 KiB block at a time.

    Written here from LZ4 blocks rather than by cramjam's streaming
    Compressor, which holds the GIL while it compresses (measured: a thread
    that compresses 16 MiB leaves the application's thread ~3 % of its
    speed); cramjam's block compression releases it, so a producer's sender
    thread compressing a batch no longer stops every other thread of the
    process. A block that does not shrink is stored as it is, as LZ4 allows.
    """
    view = memoryview(data)
    parts = [_LZ4_FRAME_HEADER]
    for start in range(0, len(data), _LZ4_BLOCK_BYTES):
        block = view[start:start + _LZ4_BLOCK_BYTES]
        packed = bytes(cramjam.lz4.compress_block(
            block, mode="high_compression", compression=LZ4_LEVEL, store_size=False))
        if len(packed) < len(block):
            parts.append(_U32_LE.pack(len(packed)))
            parts.append(packed)
        else:
            parts.append(_U32_LE.pack(len(block) | _LZ4_UNCOMPRESSED))
            parts.append(bytes(block))
    parts.append(_LZ4_END_MARK)
    return b"".join(parts)


def _xerial_snappy(data: bytes) -> bytes:
    parts = [_XERIAL_HEADER]
    view = memoryview(data)
    for start in range(0, len(data), XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start:start + XERIAL_BLOCK_BYTES]))
        parts.append(_I32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _unsnappy(data: bytes | memoryview, max_bytes: int) -> bytes:
    if len(data) < len(_XERIAL_HEADER) or bytes(data[:len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        return _unsnappy_raw(data, max_bytes)
    view = memoryview(data)
    pos = len(_XERIAL_HEADER)
    blocks = []
    total = 0
    while pos < len(view):
        if pos + 4 > len(view):
            raise CompressionError(f"xerial snappy block length at byte {pos} is cut short")
        (length,) = _I32.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > len(view):
            raise CompressionError(
                f"xerial snappy block at byte {pos} says {length} bytes, "
                f"{len(view) - pos} remain"
            )
        block = _unsnappy_raw(view[pos:pos + length], max_bytes - total)
        total += len(block)
        blocks.append(block)
        pos += length
    return b"".join(blocks)


def _unsnappy_raw(data: bytes | memoryview, max_bytes: int) -> bytes:
    # A raw snappy block starts with its uncompressed length: check it first.
    size = int(cramjam.snappy.decompress_raw_len(data))
    if size > max_bytes:
        raise CompressionError(_too_long(Codec.SNAPPY, size, max_bytes))
    return bytes(cramjam.snappy.decompress_raw(data))


def _lz4_content_size(data: bytes | memoryview) -> int | None:
    """The content size an LZ4 frame declares (FLG bit 3), if it does."""
    if len(data) < 15 or bytes(data[:4]) != _LZ4_FRAME_MAGIC:
        return None
    if not data[4] & 0x08:
        return None
    return int.from_bytes(data[6:14], "little")


def _zstd_content_size(data: bytes | memoryview) -> int | None:
    """The content size a zstd frame header declares, if it does."""
    if len(data) < 6 or bytes(data[:4]) != _ZSTD_FRAME_MAGIC:
        return None
    descriptor = data[4]
    size_flag = descriptor >> 6
    single_segment = descriptor & 0x20
    dict_id_bytes = (0, 1, 2, 4)[descriptor & 0x03]
    pos = 5 + (0 if single_segment else 1) + dict_id_bytes
    if size_flag == 0:
        if not single_segment:
            return None
        width = 1
    else:
        width = (0, 2, 4, 8)[size_flag]
    if len(data) < pos + width:
        return None
    size = int.from_bytes(data[pos:pos + width], "little")
    # A 2-byte field stores the size minus 256.
    return size + 256 if width == 2 else size
