'use strict';
// Reading a partition with Fetch. Under READ_COMMITTED the store does all the
// filtering: it returns only offsets below the last stable offset (LSO) and
// leaves out control batches and batches of aborted transactions. The client
// only decodes what it gets, skips records below the offset it asked for (a
// reply may start with a batch that begins before it), and always continues
// from `next_fetch_offset`, which moves past filtered batches too.

const { OncelogError, errorFromProto } = require('./client');
const { decodeBatch } = require('./records');

// Long-poll: how long one Fetch may wait on the store for data.
const FETCH_MAX_WAIT_MS = 500;
const FETCH_MAX_BYTES = 1024 * 1024;

/**
 * One Fetch of one partition. Returns {records, nextFetchOffset,
 * highWatermark, lastStableOffset}.
 *
 * @param {import('./client').ClusterClient} client
 * @param {{isolationLevel?: 'READ_COMMITTED'|'READ_UNCOMMITTED'}} [options]
 */
async function fetchOnce(client, topic, partition, fetchOffset, options = {}) {
  const isolationLevel = options.isolationLevel ?? 'READ_COMMITTED';
  const response = await client.onPartition(`Fetch of ${topic}-${partition}`, topic, partition,
    async (address, timeoutMs) => {
      const reply = await client.unary('store', address, 'Fetch', {
        partitions: [{
          topic, partition, fetch_offset: String(fetchOffset), max_bytes: FETCH_MAX_BYTES,
        }],
        max_wait_ms: FETCH_MAX_WAIT_MS,
        min_bytes: 1,
        max_bytes: FETCH_MAX_BYTES,
        isolation_level: isolationLevel,
      }, timeoutMs + FETCH_MAX_WAIT_MS);
      const result = reply.results.find((r) => r.topic === topic && r.partition === partition);
      if (!result) {
        throw new OncelogError('UNKNOWN_SERVER_ERROR',
          `Fetch answer has no result for ${topic}-${partition}`, false);
      }
      const exc = errorFromProto(result.error);
      if (exc) throw exc;
      return result;
    });
  const records = [];
  for (const batch of response.batches) {
    const { header, records: decoded } = decodeBatch(Buffer.from(batch), {
      minOffset: fetchOffset,
    });
    // The store never returns control batches; a client checks anyway,
    // because a marker's record is not data.
    if (header.isControl) continue;
    records.push(...decoded);
  }
  return {
    records,
    nextFetchOffset: Number(response.next_fetch_offset),
    highWatermark: Number(response.high_watermark),
    lastStableOffset: Number(response.last_stable_offset),
  };
}

/**
 * Every record from `fromOffset` until the fetch position has passed
 * `untilOffset` (the reader has seen everything up to it, filtered or
 * not). EndTxn answers once the commit is decided, before its markers have
 * landed, so the LSO may still be below a just-committed record: keep
 * fetching until it moves. Bounded by `deadlineMs`.
 */
async function readUntil(client, topic, partition, fromOffset, untilOffset, options = {}) {
  const deadlineMs = Date.now() + (options.timeoutMs ?? 30000);
  const records = [];
  let position = fromOffset;
  while (position <= untilOffset) {
    if (Date.now() > deadlineMs) {
      throw new OncelogError('REQUEST_TIMED_OUT',
        `${topic}-${partition}: the fetch position is ${position}, still not past offset ` +
        `${untilOffset} after ${options.timeoutMs ?? 30000} ms`, true);
    }
    const reply = await fetchOnce(client, topic, partition, position, options);
    records.push(...reply.records);
    position = Math.max(position, reply.nextFetchOffset);
  }
  return { records, nextFetchOffset: position };
}

module.exports = { fetchOnce, readUntil };
