'use strict';
// The encoded record batch, written and read by this client itself: the
// store never decodes records, so every client carries this codec. The byte
// layout is the one of sdk/oncelog/records.py, documented field by field in
// docs/grpc-api.md ("Record batches"). Big-endian throughout.
//
//   offset  size  field
//        0     8  base_offset             set by the store; 0 when produced
//        8     4  batch_length            bytes after this field
//       12     4  partition_leader_epoch  set by the store; -1 when produced
//       16     1  magic                   2
//       17     4  crc                     CRC32C of every byte from offset 21 on
//       21     2  attributes              0x10 transactional, 0x20 control
//       23     4  last_offset_delta       record_count - 1
//       27     8  base_timestamp_ms
//       35     8  max_timestamp_ms
//       43     8  producer_id             -1: none
//       51     2  producer_epoch          -1: none
//       53     4  base_sequence           -1: none
//       57     4  record_count
//       61     -  records
//
// Each record: int32 length of the rest, int32 offset_delta, int64
// timestamp_delta_ms, int32 key length (-1: null) + key, int32 value length
// (-1: null) + value, int32 header count, then per header int32 key length,
// UTF-8 key, int32 value length (-1: null), value.

const { crc32c } = require('./crc32c');

const BATCH_MAGIC = 2;
const HEADER_SIZE_BYTES = 61;
// The CRC covers every byte from here to the end: base_offset, batch_length,
// partition_leader_epoch, magic and the CRC itself are outside it, so the
// store can set base_offset and the epoch without recomputing it.
const CRC_START = 21;
// What a producer writes as partition_leader_epoch (the store overwrites it).
const NO_PARTITION_LEADER_EPOCH = -1;
const ATTR_TRANSACTIONAL = 0x10;
const ATTR_CONTROL = 0x20;
const NO_PRODUCER_ID = -1n;
const NO_PRODUCER_EPOCH = -1;
const NO_SEQUENCE = -1;
// Sequence numbers are non-negative int32 values; after 2^31 - 1 comes 0.
const SEQUENCE_MODULUS = 2 ** 31;
// The fixed part of a record after its length field: offset_delta (4),
// timestamp_delta_ms (8), key length (4).
const RECORD_FIXED_BYTES = 16;

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

/**
 * One record's bytes.
 * @param {number} offsetDelta
 * @param {bigint} timestampDeltaMs
 * @param {Buffer|null} key
 * @param {Buffer|null} value
 * @param {Array<[string, Buffer|null]>} headers
 */
function encodeRecord(offsetDelta, timestampDeltaMs, key, value, headers) {
  const headerParts = [];
  const count = Buffer.alloc(4);
  count.writeInt32BE(headers.length);
  headerParts.push(count);
  for (const [hkey, hvalue] of headers) {
    if (typeof hkey !== 'string') {
      throw new TypeError(`a header key must be a string, got ${typeof hkey}`);
    }
    const hk = Buffer.from(hkey, 'utf8');
    const hv = checkBytes(hvalue, `value of header ${JSON.stringify(hkey)}`);
    const lengths = Buffer.alloc(4);
    lengths.writeInt32BE(hk.length);
    const valueLength = Buffer.alloc(4);
    valueLength.writeInt32BE(hv === null ? -1 : hv.length);
    headerParts.push(lengths, hk, valueLength);
    if (hv !== null) headerParts.push(hv);
  }
  const headerBlob = Buffer.concat(headerParts);
  const keyLength = key === null ? 0 : key.length;
  const valueLength = value === null ? 0 : value.length;
  const length = RECORD_FIXED_BYTES + keyLength + 4 + valueLength + headerBlob.length;
  const fixed = Buffer.alloc(4 + RECORD_FIXED_BYTES);
  fixed.writeInt32BE(length, 0);
  fixed.writeInt32BE(offsetDelta, 4);
  fixed.writeBigInt64BE(timestampDeltaMs, 8);
  fixed.writeInt32BE(key === null ? -1 : key.length, 16);
  const valueField = Buffer.alloc(4);
  valueField.writeInt32BE(value === null ? -1 : value.length);
  const parts = [fixed];
  if (key !== null) parts.push(key);
  parts.push(valueField);
  if (value !== null) parts.push(value);
  parts.push(headerBlob);
  return Buffer.concat(parts);
}

/**
 * Encodes records into one batch, ready for PartitionBatch.batch.
 *
 * @param {Array<{key?: Buffer|null, value?: Buffer|null,
 *                headers?: Array<[string, Buffer|null]>, timestampMs: number}>} records
 * @param {{producerId?: bigint, producerEpoch?: number, baseSequence?: number,
 *          transactional?: boolean}} [options]
 * @returns {Buffer}
 */
function encodeBatch(records, options = {}) {
  const {
    producerId = NO_PRODUCER_ID,
    producerEpoch = NO_PRODUCER_EPOCH,
    baseSequence = NO_SEQUENCE,
    transactional = false,
  } = options;
  if (!Array.isArray(records) || records.length === 0) {
    throw new BatchFormatError('a record batch needs at least one record');
  }
  if (typeof producerId !== 'bigint' || producerId < -1n || producerId >= 2n ** 63n) {
    throw new RangeError(`producerId must be a bigint in -1..2^63-1, got ${producerId}`);
  }
  checkInt(producerEpoch, 'producerEpoch', -1, 2 ** 15 - 1);
  checkInt(baseSequence, 'baseSequence', -1, SEQUENCE_MODULUS - 1);
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
  const body = Buffer.concat(records.map((r, i) => encodeRecord(
    i, timestamps[i] - baseTimestampMs,
    checkBytes(r.key, `records[${i}].key`), checkBytes(r.value, `records[${i}].value`),
    r.headers || [],
  )));
  const batch = Buffer.alloc(HEADER_SIZE_BYTES + body.length);
  batch.writeBigInt64BE(0n, 0);
  batch.writeInt32BE(batch.length - 12, 8);
  batch.writeInt32BE(NO_PARTITION_LEADER_EPOCH, 12);
  batch.writeInt8(BATCH_MAGIC, 16);
  batch.writeInt16BE(transactional ? ATTR_TRANSACTIONAL : 0, 21);
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
  const end = batch.length;
  const need = (pos, size) => {
    if (pos + size > end) {
      throw new BatchFormatError(`record field at byte ${pos} runs past the end of its batch`);
    }
  };
  const readBytes = (pos) => {
    need(pos, 4);
    const length = batch.readInt32BE(pos);
    if (length < 0) return [null, pos + 4];
    need(pos + 4, length);
    return [Buffer.from(batch.subarray(pos + 4, pos + 4 + length)), pos + 4 + length];
  };
  const records = [];
  let pos = HEADER_SIZE_BYTES;
  for (let i = 0; i < header.recordCount; i++) {
    need(pos, 4 + RECORD_FIXED_BYTES);
    const length = batch.readInt32BE(pos);
    const nextPos = pos + 4 + length;
    need(pos, 4 + length);
    const offset = header.baseOffset + batch.readInt32BE(pos + 4);
    const timestampMs = toOffset(header.baseTimestampMs + batch.readBigInt64BE(pos + 8),
      'timestamp');
    if (offset < minOffset) {
      pos = nextPos;
      continue;
    }
    let p = pos + 16;
    let key;
    let value;
    [key, p] = readBytes(p);
    [value, p] = readBytes(p);
    need(p, 4);
    const headerCount = batch.readInt32BE(p);
    p += 4;
    const headers = [];
    for (let h = 0; h < headerCount; h++) {
      let hkey;
      let hvalue;
      [hkey, p] = readBytes(p);
      [hvalue, p] = readBytes(p);
      headers.push([hkey === null ? '' : hkey.toString('utf8'), hvalue]);
    }
    records.push({ offset, timestampMs, key, value, headers });
    pos = nextPos;
  }
  return { header, records };
}

module.exports = {
  ATTR_CONTROL,
  ATTR_TRANSACTIONAL,
  BATCH_MAGIC,
  BatchFormatError,
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
