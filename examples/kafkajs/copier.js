// An exactly-once copier written with KafkaJS, unchanged, against oncelog's
// Kafka listener: a consumer group reads `--input` (read_committed), and each
// batch of records is written to `--output` in one transaction together with
// the group's offsets (sendOffsets), so every input record is in the output
// exactly once even when the copier is killed and started again.
//
//   node examples/kafkajs/copier.js --brokers 127.0.0.1:9092 --input in \
//       --output out --group copier --expect 1000 [--abort-first]
//
// It stops once the group's committed offsets cover `--expect` records and
// prints one JSON line: {"copied": N, "transactions": T, "aborted": A}.
// `--abort-first` aborts the first transaction on purpose (its records must
// never be visible and its offsets never committed), then goes on.
"use strict";

const { Kafka, logLevel } = require("kafkajs");

function parseArgs(argv) {
  const args = { brokers: "", input: "", output: "", group: "", expect: 0, abortFirst: false,
                 transactionalId: "" };
  for (let i = 2; i < argv.length; i++) {
    const flag = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${flag} needs a value`);
      return argv[++i];
    };
    if (flag === "--brokers") args.brokers = next();
    else if (flag === "--input") args.input = next();
    else if (flag === "--output") args.output = next();
    else if (flag === "--group") args.group = next();
    else if (flag === "--expect") args.expect = Number(next());
    else if (flag === "--transactional-id") args.transactionalId = next();
    else if (flag === "--abort-first") args.abortFirst = true;
    else throw new Error(`unknown argument ${flag}`);
  }
  for (const name of ["brokers", "input", "output", "group"]) {
    if (!args[name]) throw new Error(`--${name} is required`);
  }
  if (!(args.expect > 0)) throw new Error("--expect must be a positive number of records");
  args.transactionalId = args.transactionalId || `${args.group}-copier`;
  return args;
}

async function committedTotal(admin, group, topic) {
  const [offsets] = await admin.fetchOffsets({ groupId: group, topics: [topic] });
  return offsets.partitions.reduce((sum, p) => sum + Math.max(Number(p.offset), 0), 0);
}

async function main() {
  const args = parseArgs(process.argv);
  const kafka = new Kafka({ clientId: "kafkajs-copier", brokers: args.brokers.split(","),
                            logLevel: logLevel.WARN, retry: { retries: 10 } });
  const admin = kafka.admin();
  const producer = kafka.producer({ transactionalId: args.transactionalId, idempotent: true,
                                    maxInFlightRequests: 1 });
  const consumer = kafka.consumer({ groupId: args.group, readUncommitted: false,
                                    sessionTimeout: 10000, rebalanceTimeout: 10000 });
  await admin.connect();
  await producer.connect();
  await consumer.connect();
  await consumer.subscribe({ topic: args.input, fromBeginning: true });

  let copied = 0;
  let transactions = 0;
  let aborted = 0;
  let abortNext = args.abortFirst;
  let done;
  const finished = new Promise((resolve) => { done = resolve; });

  await consumer.run({
    autoCommit: false,
    eachBatchAutoResolve: false,
    eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning, isStale }) => {
      if (!isRunning() || isStale() || batch.messages.length === 0) return;
      const transaction = await producer.transaction();
      try {
        await transaction.send({
          topic: args.output,
          messages: batch.messages.map((m) => ({ key: m.key, value: m.value })),
        });
        const last = batch.messages[batch.messages.length - 1];
        await transaction.sendOffsets({
          consumerGroupId: args.group,
          topics: [{ topic: batch.topic, partitions: [
            { partition: batch.partition, offset: (BigInt(last.offset) + 1n).toString() }] }],
        });
        if (abortNext) {
          abortNext = false;
          await transaction.abort();
          aborted += 1;
          // Read the aborted batch again: its offsets were not committed.
          consumer.seek({ topic: batch.topic, partition: batch.partition,
                          offset: batch.messages[0].offset });
          return;
        }
        await transaction.commit();
      } catch (error) {
        await transaction.abort().catch(() => {});
        throw error;
      }
      transactions += 1;
      copied += batch.messages.length;
      for (const m of batch.messages) resolveOffset(m.offset);
      await heartbeat();
      if (await committedTotal(admin, args.group, args.input) >= args.expect) done();
    },
  });

  const timeoutMs = 120000;
  const timer = setTimeout(() => done(new Error(`not done within ${timeoutMs} ms`)), timeoutMs);
  const error = await finished;
  clearTimeout(timer);
  await consumer.disconnect();
  await producer.disconnect();
  await admin.disconnect();
  if (error) throw error;
  console.log(JSON.stringify({ copied, transactions, aborted }));
}

main().catch((error) => {
  console.error(error && error.stack ? error.stack : String(error));
  process.exit(1);
});
