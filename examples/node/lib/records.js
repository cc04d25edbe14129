'use strict';
// The encoded record batch, written and read by this client itself: the
// store never decodes records, so every client carries this codec. It is
// Kafka's record batch v2 (magic 2), the format of sdk/oncelog/wire/records.py,
// documented field by field in docs/grpc-api.md ("Record batches").
// The header is big-endian:
//
//   offset  size  field
//        0     8  base_offset             set by the store; 0 when produced
//        8     4  batch_length            bytes after this field
//       12     4  partition_leader_epoch  set by the store; -1 when produced
//       16     1  magic                   2
//       17     4  crc                     CRC32C of every byte from offset 21 on
//       21     2  attributes              bits 0-2 codec, 0x08 log append time,
//                                         0x10 transactional, 0x20 control
//       23     4  last_offset_delta       record_count - 1
//       27     8  base_timestamp_ms
//       35     8  max_timestamp_ms
//       43     8  producer_id             -1: none
//       51     2  producer_epoch          -1: none
//       53     4  base_sequence           -1: none
//       57     4  record_count
//       61     -  records (compressed as one block when the codec is not 0)
//
// Each record, in zigzag varints (varlong: the same, 64-bit): varint length
// of the rest, int8 attributes (0), varlong timestamp_delta_ms, varint
// offset_delta, varint key length (-1: null) + key, varint value length
// (-1: null) + value, varint header count, then per header varint key
// length, UTF-8 key, varint value length (-1: null), value.
//
// Compression: this example writes and reads gzip (node's zlib) besides
// none; batches of the other codecs (snappy, lz4, zstd) are refused with an
// error that names the codec.

const zlib = require('zlib');
const { crc32c } = require('./crc32c');

const BATCH_MAGIC = 2;
const HEADER_SIZE_BYTES = 61;
// The CRC covers every byte from here to the end: base_offset, batch_length,
// partition_leader_epoch, magic and the CRC itself are outside it, so the
// store can set base_offset and the epoch without recomputing it.
const CRC_START = 21;
// What a producer writes as partition_leader_epoch (the store overwrites it).
const NO_PARTITION_LEADER_EPOCH = -1;
const ATTR_COMPRESSION_MASK = 0x07;
const ATTR_LOG_APPEND_TIME = 0x08;
const ATTR_TRANSACTIONAL = 0x10;
const ATTR_CONTROL = 0x20;
const NO_PRODUCER_ID = -1n;
const NO_PRODUCER_EPOCH = -1;
const NO_SEQUENCE = -1;
// Sequence numbers are non-negative int32 values; after 2^31 - 1 comes 0.
const SEQUENCE_MODULUS = 2 ** 31;
// Kafka's codec ids (attributes bits 0-2).
const CODECS = ['none', 'gzip', 'snappy', 'lz4', 'zstd'];
const WRITTEN_CODECS = ['none', 'gzip'];

class BatchFormatError extends Error {}

/** The sequence `count` after `sequence`, wrapping at 2^31. */
function nextSequence(sequence, count) {
  return (sequence + count) % SEQUENCE_MODULUS;
}

function checkBytes(value, what) {
  if (value === null || value === undefined) return null;
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.length);
  throw new TypeError(`${what} must be a Buffer, a Uint8Array or null, got ${typeof value}`);
}

function checkInt(value, what, min, max) {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new RangeError(`${what} must be an integer in ${min}..${max}, got ${value}`);
  }
  return value;
}

/** An int32 as a zigzag varint (Kafka's ByteUtils.writeVarint). */
function varint(value) {
  let raw = ((value << 1) ^ (value >> 31)) >>> 0;
  const out = [];
  while (raw >= 0x80) {
    out.push((raw & 0x7f) | 0x80);
    raw >>>= 7;
  }
  out.push(raw);
  return Buffer.from(out);
}

/** An int64 (a bigint) as a zigzag varlong (Kafka's ByteUtils.writeVarlong). */
function varlong(value) {
  let raw = BigInt.asUintN(64, (value << 1n) ^ (value >> 63n));
  const out = [];
  while (raw >= 0x80n) {
    out.push(Number(raw & 0x7fn) | 0x80);
    raw >>= 7n;
  }
  out.push(Number(raw));
  return Buffer.from(out);
}

/**
 * The zigzag varint at `pos` of `buf`: [value, position after it]; a bigint
 * when `long` (a varlong), else a number (an int32).
 */
function readVarint(buf, pos, end, long = false) {
  let raw = 0n;
  let shift = 0n;
  const maxBytes = long ? 10 : 5;
  for (let i = 0; i < maxBytes; i++) {
    if (pos >= end) {
      throw new BatchFormatError(`record field at byte ${pos} runs past the end of its batch`);
    }
    const byte = buf[pos++];
    raw |= BigInt(byte & 0x7f) << shift;
    if (byte < 0x80) {
      const value = (raw >> 1n) ^ -(raw & 1n);
      if (long) return [BigInt.asIntN(64, value), pos];
      return [Number(BigInt.asIntN(32, value)), pos];
    }
    shift += 7n;
  }
  throw new BatchFormatError(`varint at byte ${pos - maxBytes} is longer than ${maxBytes} bytes`);
}

/**
 * One record's bytes.
 * @param {number} offsetDelta
 * @param {bigint} timestampDeltaMs
 * @param {Buffer|null} key
 * @param {Buffer|null} value
 * @param {Array<[string, Buffer|null]>} headers
 */
function encodeRecord(offsetDelta, timestampDeltaMs, key, value, headers) {
  const parts = [
    Buffer.from([0]), varlong(timestampDeltaMs), varint(offsetDelta),
    varint(key === null ? -1 : key.length),
  ];
  if (key !== null) parts.push(key);
  parts.push(varint(value === null ? -1 : value.length));
  if (value !== null) parts.push(value);
  parts.push(varint(headers.length));
  for (const [hkey, hvalue] of headers) {
    if (typeof hkey !== 'string') {
      throw new TypeError(`a header key must be a string, got ${typeof hkey}`);
    }
    const hk = Buffer.from(hkey, 'utf8');
    const hv = checkBytes(hvalue, `value of header ${JSON.stringify(hkey)}`);
    parts.push(varint(hk.length), hk, varint(hv === null ? -1 : hv.length));
    if (hv !== null) parts.push(hv);
  }
  const body = Buffer.concat(parts);
  return Buffer.concat([varint(body.length), body]);
}

/**
 * Encodes records into one batch, ready for PartitionBatch.batch.
 *
 * @param {Array<{key?: Buffer|null, value?: Buffer|null,
 *                headers?: Array<[string, Buffer|null]>, timestampMs: number}>} records
 * @param {{producerId?: bigint, producerEpoch?: number, baseSequence?: number,
 *          transactional?: boolean, compression?: 'none'|'gzip'}} [options]
 * @returns {Buffer}
 */
function encodeBatch(records, options = {}) {
  const {
    producerId = NO_PRODUCER_ID,
    producerEpoch = NO_PRODUCER_EPOCH,
    baseSequence = NO_SEQUENCE,
    transactional = false,
    compression = 'none',
  } = options;
  if (!Array.isArray(records) || records.length === 0) {
    throw new BatchFormatError('a record batch needs at least one record');
  }
  if (typeof producerId !== 'bigint' || producerId < -1n || producerId >= 2n ** 63n) {
    throw new RangeError(`producerId must be a bigint in -1..2^63-1, got ${producerId}`);
  }
  checkInt(producerEpoch, 'producerEpoch', -1, 2 ** 15 - 1);
  checkInt(baseSequence, 'baseSequence', -1, SEQUENCE_MODULUS - 1);
  if (!WRITTEN_CODECS.includes(compression)) {
    throw new RangeError(`compression must be one of ${WRITTEN_CODECS.join(', ')} in this ` +
      `example (Kafka's ${CODECS.join(', ')} need libraries it does not use), got ${compression}`);
  }
  if (producerId >= 0n && baseSequence === NO_SEQUENCE) {
    throw new BatchFormatError(`a batch of producer ${producerId} needs a baseSequence`);
  }
  if (transactional && producerId < 0n) {
    throw new BatchFormatError('a transactional batch needs a producerId');
  }
  const timestamps = records.map((r, i) =>
    BigInt(checkInt(r.timestampMs, `records[${i}].timestampMs`, 0, Number.MAX_SAFE_INTEGER)));
  const baseTimestampMs = timestamps.reduce((a, b) => (b < a ? b : a));
  const maxTimestampMs = timestamps.reduce((a, b) => (b > a ? b : a));
  let body = Buffer.concat(records.map((r, i) => encodeRecord(
    i, timestamps[i] - baseTimestampMs,
    checkBytes(r.key, `records[${i}].key`), checkBytes(r.value, `records[${i}].value`),
    r.headers || [],
  )));
  let attributes = transactional ? ATTR_TRANSACTIONAL : 0;
  if (compression === 'gzip') {
    body = zlib.gzipSync(body);
    attributes |= CODECS.indexOf('gzip');
  }
  const batch = Buffer.alloc(HEADER_SIZE_BYTES + body.length);
  batch.writeBigInt64BE(0n, 0);
  batch.writeInt32BE(batch.length - 12, 8);
  batch.writeInt32BE(NO_PARTITION_LEADER_EPOCH, 12);
  batch.writeInt8(BATCH_MAGIC, 16);
  batch.writeInt16BE(attributes, 21);
  batch.writeInt32BE(records.length - 1, 23);
  batch.writeBigInt64BE(baseTimestampMs, 27);
  batch.writeBigInt64BE(maxTimestampMs, 35);
  batch.writeBigInt64BE(producerId, 43);
  batch.writeInt16BE(producerEpoch, 51);
  batch.writeInt32BE(baseSequence, 53);
  batch.writeInt32BE(records.length, 57);
  body.copy(batch, HEADER_SIZE_BYTES);
  // Last: the CRC covers everything after its own field.
  batch.writeUInt32BE(crc32c(batch.subarray(CRC_START)), 17);
  return batch;
}

/** Int64 offsets as JavaScript numbers: exact below 2^53, refused above. */
function toOffset(value, what) {
  if (value > BigInt(Number.MAX_SAFE_INTEGER) || value < BigInt(Number.MIN_SAFE_INTEGER)) {
    throw new RangeError(`${what} ${value} does not fit a JavaScript number exactly`);
  }
  return Number(value);
}

/**
 * The fixed header of an encoded batch (no CRC check).
 * @param {Buffer} batch
 */
function readHeader(batch) {
  if (batch.length < HEADER_SIZE_BYTES) {
    throw new BatchFormatError(
      `record batch is ${batch.length} bytes, shorter than the ${HEADER_SIZE_BYTES}-byte header`);
  }
  const attributes = batch.readInt16BE(21);
  return {
    baseOffset: toOffset(batch.readBigInt64BE(0), 'base_offset'),
    batchLength: batch.readInt32BE(8),
    partitionLeaderEpoch: batch.readInt32BE(12),
    magic: batch.readInt8(16),
    crc: batch.readUInt32BE(17),
    attributes,
    compression: CODECS[attributes & ATTR_COMPRESSION_MASK] ?? null,
    isTransactional: Boolean(attributes & ATTR_TRANSACTIONAL),
    isControl: Boolean(attributes & ATTR_CONTROL),
    lastOffsetDelta: batch.readInt32BE(23),
    baseTimestampMs: batch.readBigInt64BE(27),
    maxTimestampMs: batch.readBigInt64BE(35),
    producerId: batch.readBigInt64BE(43),
    producerEpoch: batch.readInt16BE(51),
    baseSequence: batch.readInt32BE(53),
    recordCount: batch.readInt32BE(57),
  };
}

/** The records part of a batch, decompressed: [bytes, start, end]. */
function recordsPart(batch, header) {
  const codecId = header.attributes & ATTR_COMPRESSION_MASK;
  if (codecId === 0) return [batch, HEADER_SIZE_BYTES, batch.length];
  const name = CODECS[codecId];
  if (name === undefined) {
    throw new BatchFormatError(`record batch compression codec is ${codecId}; expected 0 none, ` +
      '1 gzip, 2 snappy, 3 lz4 or 4 zstd');
  }
  if (header.recordCount === 0) return [Buffer.alloc(0), 0, 0];
  if (name !== 'gzip') {
    throw new BatchFormatError(`record batch at offset ${header.baseOffset} is compressed with ` +
      `${name} (codec ${codecId}); this example reads none and gzip only`);
  }
  let data;
  try {
    data = zlib.gunzipSync(batch.subarray(HEADER_SIZE_BYTES));
  } catch (exc) {
    throw new BatchFormatError(`gzip records do not decompress: ${exc.message}`);
  }
  return [data, 0, data.length];
}

/**
 * Checks a batch from a Fetch (magic, length, CRC) and decodes its records,
 * leaving out those below `minOffset` (a Fetch may start with a batch that
 * begins before the offset asked for).
 *
 * @param {Buffer} batch
 * @param {{minOffset?: number}} [options]
 */
function decodeBatch(batch, options = {}) {
  const minOffset = options.minOffset ?? 0;
  const header = readHeader(batch);
  if (header.magic !== BATCH_MAGIC) {
    throw new BatchFormatError(`record batch magic is ${header.magic}, expected ${BATCH_MAGIC}`);
  }
  if (header.batchLength !== batch.length - 12) {
    throw new BatchFormatError(
      `record batch length field says ${header.batchLength} bytes follow it, ` +
      `but ${batch.length - 12} do`);
  }
  const actualCrc = crc32c(batch.subarray(CRC_START));
  if (actualCrc !== header.crc) {
    throw new BatchFormatError(
      `record batch CRC32C is 0x${actualCrc.toString(16)}, header says 0x${header.crc.toString(16)}`);
  }
  const [data, start, end] = recordsPart(batch, header);
  const logAppendTime = Boolean(header.attributes & ATTR_LOG_APPEND_TIME);
  const readBytes = (pos) => {
    const [length, after] = readVarint(data, pos, end);
    if (length < 0) return [null, after];
    if (after + length > end) {
      throw new BatchFormatError(`record field at byte ${after} runs past the end of its batch`);
    }
    return [Buffer.from(data.subarray(after, after + length)), after + length];
  };
  const records = [];
  let pos = start;
  for (let i = 0; i < header.recordCount; i++) {
    const [length, bodyStart] = readVarint(data, pos, end);
    const nextPos = bodyStart + length;
    if (length < 0 || nextPos > end) {
      throw new BatchFormatError(`record at byte ${pos} says ${length} bytes, ` +
        `${end - bodyStart} remain`);
    }
    let p = bodyStart + 1; // attributes: unused
    let timestampDeltaMs;
    let offsetDelta;
    [timestampDeltaMs, p] = readVarint(data, p, end, true);
    [offsetDelta, p] = readVarint(data, p, end);
    const offset = header.baseOffset + offsetDelta;
    if (offset < minOffset) {
      pos = nextPos;
      continue;
    }
    const timestampMs = toOffset(
      logAppendTime ? header.maxTimestampMs : header.baseTimestampMs + timestampDeltaMs,
      'timestamp');
    let key;
    let value;
    let headerCount;
    [key, p] = readBytes(p);
    [value, p] = readBytes(p);
    [headerCount, p] = readVarint(data, p, end);
    if (headerCount < 0) {
      throw new BatchFormatError(`record at byte ${pos} has ${headerCount} headers`);
    }
    const headers = [];
    for (let h = 0; h < headerCount; h++) {
      let hkey;
      let hvalue;
      [hkey, p] = readBytes(p);
      [hvalue, p] = readBytes(p);
      headers.push([hkey === null ? '' : hkey.toString('utf8'), hvalue]);
    }
    if (p !== nextPos) {
      throw new BatchFormatError(`record at byte ${pos} says ${length} bytes but holds ` +
        `${p - bodyStart}`);
    }
    records.push({ offset, timestampMs, key, value, headers });
    pos = nextPos;
  }
  if (pos !== end) {
    throw new BatchFormatError(`record batch holds ${end - pos} bytes after its ` +
      `${header.recordCount} records`);
  }
  return { header, records };
}

module.exports = {
  ATTR_COMPRESSION_MASK,
  ATTR_CONTROL,
  ATTR_LOG_APPEND_TIME,
  ATTR_TRANSACTIONAL,
  BATCH_MAGIC,
  BatchFormatError,
  CODECS,
  CRC_START,
  HEADER_SIZE_BYTES,
  NO_PARTITION_LEADER_EPOCH,
  NO_SEQUENCE,
  SEQUENCE_MODULUS,
  decodeBatch,
  encodeBatch,
  nextSequence,
  readHeader,
};
