#!/usr/bin/env node
'use strict';
// The example's record-batch codec on stdin/stdout, so it can be checked byte
// for byte against another implementation (tests/integration/test_node_client.py
// compares it with sdk/oncelog/records.py). Bytes travel as hex, null as null.
//
//   node codec_tool.js encode   < {"records": [{"key": hex|null, "value": hex|null,
//                                   "headers": [[str, hex|null]], "timestamp_ms": int}],
//                                  "producer_id": "int64", "producer_epoch": int,
//                                  "base_sequence": int, "transactional": bool,
//                                  "compression": "none"|"gzip"}
//                               > {"batch": hex}
//   node codec_tool.js decode   < {"batch": hex, "min_offset": int}
//                               > {"header": {...}, "records": [...]}
//   node codec_tool.js crc32c   < {"data": hex}  > {"crc32c": uint32}

const { crc32c } = require('./lib/crc32c');
const { decodeBatch, encodeBatch } = require('./lib/records');

const fromHex = (hex) => (hex === null ? null : Buffer.from(hex, 'hex'));
const toHex = (bytes) => (bytes === null ? null : bytes.toString('hex'));

const commands = {
  encode(input) {
    const batch = encodeBatch(input.records.map((r) => ({
      key: fromHex(r.key), value: fromHex(r.value),
      headers: (r.headers || []).map(([k, v]) => [k, fromHex(v)]),
      timestampMs: r.timestamp_ms,
    })), {
      producerId: BigInt(input.producer_id ?? -1),
      producerEpoch: input.producer_epoch ?? -1,
      baseSequence: input.base_sequence ?? -1,
      transactional: Boolean(input.transactional),
      compression: input.compression ?? 'none',
    });
    return { batch: toHex(batch) };
  },
  decode(input) {
    const { header, records } = decodeBatch(fromHex(input.batch),
      { minOffset: input.min_offset ?? 0 });
    return {
      header: {
        base_offset: header.baseOffset,
        partition_leader_epoch: header.partitionLeaderEpoch,
        attributes: header.attributes,
        compression: header.compression,
        is_transactional: header.isTransactional,
        is_control: header.isControl,
        producer_id: header.producerId.toString(),
        producer_epoch: header.producerEpoch,
        base_sequence: header.baseSequence,
        record_count: header.recordCount,
        base_timestamp_ms: Number(header.baseTimestampMs),
        max_timestamp_ms: Number(header.maxTimestampMs),
      },
      records: records.map((r) => ({
        offset: r.offset, timestamp_ms: r.timestampMs, key: toHex(r.key), value: toHex(r.value),
        headers: r.headers.map(([k, v]) => [k, toHex(v)]),
      })),
    };
  },
  crc32c(input) {
    return { crc32c: crc32c(fromHex(input.data)) };
  },
};

function main() {
  const command = commands[process.argv[2]];
  if (!command) {
    process.stderr.write(`usage: node codec_tool.js ${Object.keys(commands).join('|')} < JSON\n`);
    process.exit(2);
  }
  const chunks = [];
  process.stdin.on('data', (chunk) => chunks.push(chunk));
  process.stdin.on('end', () => {
    try {
      const output = command(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      process.stdout.write(`${JSON.stringify(output)}\n`);
    } catch (exc) {
      process.stderr.write(`codec_tool ${process.argv[2]} failed: ${exc.message}\n`);
      process.exit(1);
    }
  });
}

main();
