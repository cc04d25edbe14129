#!/usr/bin/env node
'use strict';
// A whole transaction from Node.js, built on the protos alone, then read back
// with read_committed:
//
//   1. Metadata -> FindCoordinator -> InitProducerId (fences earlier
//      instances of the transactional id; retries CONCURRENT_TRANSACTIONS);
//   2. transaction 1: AddPartitionsToTxn, two batches (sequence 0, then 3),
//      a re-send of the second batch's identical bytes (the store answers
//      `duplicate` with its original offset), EndTxn(commit);
//   3. transaction 2: one batch, EndTxn(abort);
//   4. transaction 3: one batch, EndTxn(commit);
//   5. a READ_COMMITTED Fetch from --from-offset (default: the first offset
//      this run wrote) until past the last committed record: it must return
//      exactly the committed records and none of the aborted ones.
//
// Prints one JSON report on stdout; exits 1 (with the reason on stderr) if
// anything failed or the read-back differs from what was committed.
//
//   node transaction_example.js --bootstrap 127.0.0.1:PORT --topic payments \
//       [--partition 0] [--transactional-id ID] [--from-offset 0] [--timeout-ms 60000] \
//       [--transaction-timeout-ms 60000] [--protos DIR]
//
// A secured cluster: TLS and a client certificate (or a bearer token) come
// from the environment, as for the `oncelog` CLI: ONCELOG_SSL_CAFILE,
// ONCELOG_SSL_CERTFILE, ONCELOG_SSL_KEYFILE, ONCELOG_SASL_OAUTH_TOKEN_FILE
// (lib/client.js). The principal needs Write on the topic and on the
// transactional id, and Read on the topic for the read-back.

const { ClusterClient } = require('./lib/client');
const { TransactionalProducer } = require('./lib/producer');
const { readUntil } = require('./lib/reader');

const USAGE = 'usage: node transaction_example.js --bootstrap HOST:PORT --topic TOPIC ' +
  '[--partition N] [--transactional-id ID] [--from-offset N] [--timeout-ms N] ' +
  '[--transaction-timeout-ms N] [--protos DIR]';

function parseArgs(argv) {
  const options = {
    partition: 0, transactionalId: `node-example-${process.pid}`, fromOffset: undefined,
    timeoutMs: 60000, transactionTimeoutMs: 60000, protoDir: undefined,
  };
  const names = {
    '--bootstrap': 'bootstrap', '--topic': 'topic', '--partition': 'partition',
    '--transactional-id': 'transactionalId', '--from-offset': 'fromOffset',
    '--timeout-ms': 'timeoutMs', '--transaction-timeout-ms': 'transactionTimeoutMs',
    '--protos': 'protoDir',
  };
  const numeric = new Set(['partition', 'fromOffset', 'timeoutMs', 'transactionTimeoutMs']);
  for (let i = 0; i < argv.length; i += 2) {
    const name = names[argv[i]];
    if (!name || i + 1 >= argv.length) throw new Error(`bad argument ${argv[i]}\n${USAGE}`);
    let value = argv[i + 1];
    if (numeric.has(name)) {
      if (!/^\d+$/.test(value)) throw new Error(`${argv[i]} must be a non-negative integer`);
      value = Number(value);
    }
    options[name] = value;
  }
  if (!options.bootstrap || !options.topic) throw new Error(USAGE);
  return options;
}

/** A record's bytes as JSON: UTF-8 text (this example only writes text). */
const text = (bytes) => (bytes === null ? null : bytes.toString('utf8'));

function recordJson(record) {
  return {
    offset: record.offset,
    key: text(record.key),
    value: text(record.value),
    headers: record.headers.map(([k, v]) => [k, text(v)]),
  };
}

/** The records this example writes: a key, a value, one header, now as timestamp. */
function makeRecords(label, count, { nullKey = false } = {}) {
  const timestampMs = Date.now();
  return Array.from({ length: count }, (_, i) => ({
    key: nullKey ? null : Buffer.from(`acct-${i}`),
    value: Buffer.from(`${label}-${i}`),
    headers: [['writer', Buffer.from('node')], ['trace', i === 0 ? null : Buffer.from(`t${i}`)]],
    timestampMs: timestampMs + i,
  }));
}

/** The records of `batch` as they sit in the log from `baseOffset` on. */
const placed = (records, baseOffset) => records.map((r, i) => ({
  offset: baseOffset + i, key: text(r.key ?? null), value: text(r.value ?? null),
  headers: r.headers.map(([k, v]) => [k, text(v)]),
}));

async function run(options) {
  const client = new ClusterClient(options.bootstrap, { protoDir: options.protoDir });
  const report = {
    transactional_id: options.transactionalId, topic: options.topic,
    partition: options.partition, transactions: [],
  };
  try {
    const producer = new TransactionalProducer(client, options.transactionalId, {
      budgetMs: options.timeoutMs, transactionTimeoutMs: options.transactionTimeoutMs,
    });
    const { topic, partition } = options;
    // Fails at once, naming it, when the topic or partition does not exist.
    await client.leader(topic, partition);
    await producer.initTransactions();
    report.producer_id = producer.producerId.toString();
    report.init_epoch = producer.producerEpoch;
    report.init_retries = { ...client.retries };

    const transaction = async (label, batches, commit) => {
      const epoch = producer.producerEpoch;
      producer.beginTransaction();
      const written = [];
      const sent = [];
      for (const records of batches) {
        const result = await producer.send(topic, partition, records);
        sent.push(result);
        written.push({
          base_sequence: result.baseSequence, base_offset: result.baseOffset,
          duplicate: result.duplicate, records: placed(records, result.baseOffset),
        });
      }
      const entry = { label, outcome: commit ? 'commit' : 'abort', producer_epoch: epoch,
        batches: written };
      if (label === 'txn-1') {
        // A retry re-sends the identical bytes; the store recognises them.
        const last = sent[sent.length - 1];
        const again = await producer.produceBatch(topic, partition, last.batch);
        entry.resent_batch = { base_offset: again.baseOffset, duplicate: again.duplicate };
      }
      entry.next_epoch = await producer.endTransaction(commit);
      report.transactions.push(entry);
    };

    try {
      await transaction('txn-1', [makeRecords('txn-1-a', 3), makeRecords('txn-1-b', 2,
        { nullKey: true })], true);
      await transaction('txn-2', [makeRecords('txn-2', 2)], false);
      await transaction('txn-3', [makeRecords('txn-3', 1)], true);
    } catch (exc) {
      // A transaction that cannot commit (a batch failed for good) is
      // aborted before giving up, so it does not hold read_committed readers
      // back until its timeout. A fenced producer has nothing to abort.
      if (producer.inTransaction && !producer.fatalError) {
        await producer.abortTransaction().catch((abortExc) => {
          process.stderr.write(`aborting the failed transaction failed too: ${abortExc}\n`);
        });
      }
      throw exc;
    }

    const fromOffset = options.fromOffset ?? report.transactions[0].batches[0].base_offset;
    const committed = report.transactions.filter((t) => t.outcome === 'commit')
      .flatMap((t) => t.batches.flatMap((b) => b.records))
      .filter((r) => r.offset >= fromOffset);
    const aborted = report.transactions.filter((t) => t.outcome === 'abort')
      .flatMap((t) => t.batches.flatMap((b) => b.records));
    const lastCommitted = Math.max(...committed.map((r) => r.offset));
    const read = await readUntil(client, topic, partition, fromOffset, lastCommitted, {
      isolationLevel: 'READ_COMMITTED', timeoutMs: options.timeoutMs,
    });
    report.read_from_offset = fromOffset;
    report.read_committed = read.records.map(recordJson);
    report.next_fetch_offset = read.nextFetchOffset;
    report.retries = { ...client.retries };

    // The example checks itself: what read_committed returned is exactly
    // what was committed (other writers' committed records aside), at the
    // offsets Produce reported, and nothing that was aborted.
    const ours = new Set([...committed, ...aborted].map((r) => r.offset));
    const readOurs = report.read_committed.filter((r) => ours.has(r.offset));
    const problems = [];
    if (JSON.stringify(readOurs) !== JSON.stringify(committed)) {
      problems.push(`read_committed returned ${JSON.stringify(readOurs)}, ` +
        `expected the committed records ${JSON.stringify(committed)}`);
    }
    const abortedOffsets = new Set(aborted.map((r) => r.offset));
    const leaked = report.read_committed.filter((r) => abortedOffsets.has(r.offset));
    if (leaked.length) problems.push(`aborted records were returned: ${JSON.stringify(leaked)}`);
    const txn1 = report.transactions[0];
    const lastBatch = txn1.batches[txn1.batches.length - 1];
    if (!txn1.resent_batch.duplicate || txn1.resent_batch.base_offset !== lastBatch.base_offset) {
      problems.push(`re-sending a batch was not answered as a duplicate at offset ` +
        `${lastBatch.base_offset}: ${JSON.stringify(txn1.resent_batch)}`);
    }
    report.ok = problems.length === 0;
    process.stdout.write(`${JSON.stringify(report)}\n`);
    if (problems.length) throw new Error(problems.join('\n'));
  } finally {
    client.close();
  }
}

if (require.main === module) {
  let options;
  try {
    options = parseArgs(process.argv.slice(2));
  } catch (exc) {
    process.stderr.write(`${exc.message}\n`);
    process.exit(2);
  }
  run(options).catch((exc) => {
    process.stderr.write(`transaction_example failed: ${exc.stack || exc}\n`);
    process.exit(1);
  });
}

module.exports = { run };
