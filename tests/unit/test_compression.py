"""The compression codecs of record batches, and their limits.

Goal: each codec round-trips the records part, in the form Kafka writes it
(a gzip member; snappy in the xerial framing, read raw too; an LZ4 frame of
independent blocks, as Kafka's Java reader requires; a zstd frame).
Decompression stops at a bound, so a few compressed bytes cannot make a
reader (the store, for a compacted topic's keys) allocate gigabytes: gzip
and snappy before producing the excess, lz4 and zstd from the size their
frame declares or, failing that, from what they produced. Undecodable
bytes are a CompressionError naming the codec; a batch whose records do
not decompress is a BatchFormatError; codec ids 5-7 are UnsupportedCodecError.
A batch that compression would make larger is sent uncompressed.

Method: compress with our codec and with the libraries directly (framings
built by hand where the library has no option for them), decompress with
bounds just below and at the size, and read the batches with
oncelog.wire.records.
"""

from __future__ import annotations

import gzip
import os
import struct

import cramjam
import pytest

from oncelog.wire import compression as comp
from oncelog.wire import records
from oncelog.wire.compression import Codec, CompressionError

DATA = b"".join(b"record %d of a batch, " % i for i in range(5000))
CODECS = [c for c in Codec if c is not Codec.NONE]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_each_codec_round_trips_within_its_bound(codec: Codec) -> None:
    packed = comp.compress(codec, DATA)
    assert len(packed) < len(DATA) // 4
    assert comp.decompress(codec, packed, max_bytes=len(DATA)) == DATA
    assert comp.decompress(codec, memoryview(packed), max_bytes=len(DATA)) == DATA
    with pytest.raises(CompressionError, match=f"{codec.name.lower()} records decompress to"):
        comp.decompress(codec, packed, max_bytes=len(DATA) - 1)


def test_the_forms_kafka_writes() -> None:
    # gzip: a member (RFC 1952) the standard library reads, with mtime 0.
    packed = comp.compress(Codec.GZIP, DATA)
    assert packed[:2] == b"\x1f\x8b" and gzip.decompress(packed) == DATA
    assert struct.unpack_from("<I", packed, 4) == (0,)
    # Two members one after the other read as their concatenation.
    assert comp.decompress(Codec.GZIP, packed + gzip.compress(b"tail"),
                           max_bytes=len(DATA) + 4) == DATA + b"tail"
    # snappy: the xerial framing, one block per 32 KiB of input.
    packed = comp.compress(Codec.SNAPPY, DATA)
    assert packed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    blocks, pos = 0, 16
    while pos < len(packed):
        (length,) = struct.unpack_from(">i", packed, pos)
        pos += 4 + length
        blocks += 1
    assert blocks == -(-len(DATA) // comp.XERIAL_BLOCK_BYTES)
    # Raw snappy (librdkafka) reads too.
    raw = bytes(cramjam.snappy.compress_raw(DATA))
    assert comp.decompress(Codec.SNAPPY, raw, max_bytes=len(DATA)) == DATA
    # lz4: a frame (magic 0x184D2204), FLG version 1 with independent blocks.
    packed = comp.compress(Codec.LZ4, DATA)
    assert packed[:4] == b"\x04\x22\x4d\x18"
    assert packed[4] >> 6 == 1 and packed[4] & 0x20
    # zstd: a frame (magic 0xFD2FB528).
    assert comp.compress(Codec.ZSTD, DATA)[:4] == b"\x28\xb5\x2f\xfd"


def test_lz4_frames_are_built_from_independent_blocks() -> None:
    """The producer's LZ4 frames are written here from cramjam's block
    compression (which releases the GIL; its streaming compressor does not):
    a descriptor with independent blocks, no checksums and 64 KiB blocks,
    whose checksum byte is XXH32's (checked against the hash's published
    values and cramjam's own frames); a block that would grow is stored as
    it is; an empty input is a frame of no block. Every frame reads back
    with cramjam's frame decoder."""
    assert [comp._xxh32(data) for data in (b"", b"a", b"abc")] == [
        0x02CC5D05, 0x550D7456, 0x32D153FF]
    theirs = cramjam.lz4.Compressor(level=9, content_checksum=False, block_linked=False)
    theirs.compress(DATA)
    frame = bytes(theirs.finish())
    assert frame[6] == (comp._xxh32(frame[4:6]) >> 8) & 0xFF
    noise = os.urandom(70_000)
    for data, blocks in ((DATA, -(-len(DATA) // 65_536)), (noise, 2), (b"", 0)):
        packed = comp.compress(Codec.LZ4, data)
        assert packed[:7] == b"\x04\x22\x4d\x18\x60\x40" + bytes(
            ((comp._xxh32(b"\x60\x40") >> 8) & 0xFF,))
        assert packed[-4:] == b"\x00\x00\x00\x00"
        sizes, pos = [], 7
        while pos < len(packed) - 4:
            (size,) = struct.unpack_from("<I", packed, pos)
            sizes.append(size)
            pos += 4 + (size & 0x7FFFFFFF)
        assert pos == len(packed) - 4 and len(sizes) == blocks
        if data is noise:
            assert all(size & 0x80000000 for size in sizes)   # stored, not grown
        assert bytes(cramjam.lz4.decompress(packed)) == data
        assert comp.decompress(Codec.LZ4, packed, max_bytes=len(data)) == data


def test_bounds_hold_before_the_excess_is_made() -> None:
    bomb = b"\x00" * (64 * 1024 * 1024)
    # snappy says its size first: refused before decompressing.
    raw = bytes(cramjam.snappy.compress_raw(bomb))
    with pytest.raises(CompressionError, match=f"decompress to {len(bomb)} bytes"):
        comp.decompress(Codec.SNAPPY, raw, max_bytes=1000)
    # gzip stops at the bound (max_bytes + 1 produced, no more).
    with pytest.raises(CompressionError, match="over the limit of 1000"):
        comp.decompress(Codec.GZIP, gzip.compress(bomb), max_bytes=1000)
    # lz4 and zstd frames that declare their size.
    for codec, packed in ((Codec.LZ4, bytes(cramjam.lz4.compress(bomb))),
                          (Codec.ZSTD, bytes(cramjam.zstd.compress(bomb, level=1)))):
        declared = (comp._lz4_content_size(packed) if codec is Codec.LZ4
                    else comp._zstd_content_size(packed))
        if declared is not None:
            assert declared == len(bomb)
        with pytest.raises(CompressionError, match="over the limit of 1000"):
            comp.decompress(codec, packed, max_bytes=1000)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_undecodable_bytes_name_the_codec(codec: Codec) -> None:
    with pytest.raises(CompressionError, match=codec.name.lower()):
        comp.decompress(codec, b"\x07" * 64, max_bytes=1 << 20)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_a_batch_over_the_records_limit_is_refused(
        codec: Codec, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = records.encode_batch([(None, DATA, None, 1)], compression=codec)
    assert records.read_header(batch).compression is codec
    monkeypatch.setattr(records, "MAX_UNCOMPRESSED_RECORDS_BYTES", len(DATA) // 2)
    for read in (records.iter_records, records.iter_record_keys):
        with pytest.raises(records.BatchFormatError, match="over the limit"):
            list(read(batch))


def test_incompressible_records_go_out_uncompressed() -> None:
    noise = os.urandom(4000)
    for codec in CODECS:
        batch = records.encode_batch([(b"k", noise, None, 1)], compression=codec)
        assert records.read_header(batch).compression is Codec.NONE
        assert [r.value for r in records.iter_records(batch)] == [noise]


def test_codecs_5_to_7_are_refused_as_unsupported() -> None:
    plain = bytearray(records.encode_batch([(b"k", b"v", None, 1)]))
    for codec_id in (5, 6, 7):
        struct.pack_into(">h", plain, records.ATTRIBUTES_POS, codec_id)
        struct.pack_into(">I", plain, records.CRC_POS,
                         records.crc32c(memoryview(plain)[records.CRC_START:]))
        with pytest.raises(records.UnsupportedCodecError, match=f"codec is {codec_id}"):
            records.validate_batch(bytes(plain), max_size_bytes=1 << 20)
        with pytest.raises(records.UnsupportedCodecError):
            list(records.iter_records(bytes(plain)))
