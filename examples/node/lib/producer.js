'use strict';
// A transactional producer, the smallest one that is correct: the flow and the
// error handling of sdk/oncelog/producer.py without its batching and
// pipelining (one batch in flight at a time, which the "at most 5 in flight
// per partition" rule allows).
//
//   FindCoordinator -> InitProducerId -> per transaction:
//   AddPartitionsToTxn -> Produce ... -> EndTxn(commit | abort)
//
// Transaction version 2: EndTxn answers with the producer id and epoch for
// the next transaction (the epoch is bumped at every commit and abort), and
// sequence numbers start again at 0 on every partition.

const { COORDINATOR_MOVED, OncelogError, errorFromProto } = require('./client');
const { encodeBatch, nextSequence } = require('./records');

const partitionKey = (topic, partition) => `${topic}\u0000${partition}`;

class TransactionalProducer {
  /**
   * @param {import('./client').ClusterClient} client
   * @param {string} transactionalId
   * @param {{transactionTimeoutMs?: number, budgetMs?: number}} [options]
   */
  constructor(client, transactionalId, options = {}) {
    if (typeof transactionalId !== 'string' || transactionalId === '') {
      throw new Error('transactionalId must be a non-empty string');
    }
    this.client = client;
    this.transactionalId = transactionalId;
    this.transactionTimeoutMs = options.transactionTimeoutMs ?? 60000;
    // How long each blocking step may keep retrying.
    this.budgetMs = options.budgetMs ?? 60000;
    this.producerId = -1n;
    this.producerEpoch = -1;
    this.coordinatorAddress = null;
    this.inTransaction = false;
    // Partitions added to the open transaction.
    this.added = new Set();
    // Next base sequence per partition, under the current epoch.
    this.sequences = new Map();
    // Set once the producer is fenced (or lost data): every later call throws it.
    this.fatalError = null;
    // Set when a batch or an AddPartitionsToTxn of the open transaction failed
    // for good: the transaction can only be aborted.
    this.abortableError = null;
  }

  _checkUsable() {
    if (this.fatalError) throw this.fatalError;
  }

  _checkCanCommit() {
    this._checkUsable();
    if (this.abortableError) {
      throw new OncelogError('TRANSACTION_ABORTABLE',
        `the transaction of ${this.transactionalId} failed ` +
        `(${this.abortableError.message}); abort it with abortTransaction()`, false);
    }
  }

  _failIfFatal(exc) {
    if (exc instanceof OncelogError && exc.fatal) this.fatalError = exc;
    return exc;
  }

  /** A failure inside the open transaction: fatal, or it breaks the transaction. */
  _failTransaction(exc) {
    this._failIfFatal(exc);
    if (!this.fatalError) this.abortableError = exc;
    return exc;
  }

  /**
   * A failure of InitProducerId or EndTxn: running out of time leaves the
   * state as it is (call again: the same request is sent); anything else is
   * fatal, as in Kafka's producer.
   */
  _failUnlessTimedOut(exc) {
    if (!(exc instanceof OncelogError && exc.retriable)) this.fatalError = exc;
    return exc;
  }

  /** Asks any coordinator which one owns the transactional id. */
  async _findCoordinator(timeoutMs) {
    const md = await this.client.metadata();
    if (md.coordinators.length === 0) {
      throw new OncelogError('COORDINATOR_NOT_AVAILABLE',
        'the cluster has no transaction coordinator (Metadata lists none)', false);
    }
    const askAt = md.coordinators[Math.floor(Math.random() * md.coordinators.length)];
    const response = await this.client.unary('coordinator', askAt, 'FindCoordinator',
      { key: this.transactionalId, type: 'TRANSACTION' }, timeoutMs);
    const exc = errorFromProto(response.error);
    if (exc) throw exc;
    if (!response.address) {
      throw new OncelogError('COORDINATOR_NOT_AVAILABLE',
        `FindCoordinator named no address for ${this.transactionalId}`, true);
    }
    this.coordinatorAddress = response.address;
    return response.address;
  }

  /**
   * A call to the transactional id's coordinator, with retries: the
   * coordinator is found again after errors that say it may have moved, and
   * every retry sends the same request (same producer id and epoch).
   */
  async _coordinatorCall(method, request) {
    try {
      return await this.client.withRetries(`${method} of ${this.transactionalId}`,
        async (timeoutMs) => {
          const address = this.coordinatorAddress ?? await this._findCoordinator(timeoutMs);
          const response = await this.client.unary('coordinator', address, method, request,
            timeoutMs);
          // The coordinator sends request-level errors as a gRPC status; a
          // response's own error field is checked too, as the contract allows it.
          const exc = errorFromProto(response.error);
          if (exc) throw exc;
          return response;
        }, {
          budgetMs: this.budgetMs,
          onRetry: (exc) => {
            if (COORDINATOR_MOVED.has(exc.code)) this.coordinatorAddress = null;
          },
        });
    } catch (exc) {
      throw this._failIfFatal(exc);
    }
  }

  /**
   * InitProducerId: the producer id and a new epoch. Fences every earlier
   * instance with this transactional id; a transaction such an instance left
   * open is aborted first, meanwhile the coordinator answers
   * CONCURRENT_TRANSACTIONS and we retry.
   */
  async initTransactions() {
    this._checkUsable();
    let response;
    try {
      response = await this._coordinatorCall('InitProducerId', {
        transactional_id: this.transactionalId,
        transaction_timeout_ms: this.transactionTimeoutMs,
        producer_id: '-1',
        producer_epoch: -1,
      });
    } catch (exc) {
      throw this._failUnlessTimedOut(exc);
    }
    this._setIdentity(response.producer_id, response.producer_epoch);
  }

  _setIdentity(producerId, producerEpoch) {
    this.producerId = BigInt(producerId);
    this.producerEpoch = producerEpoch;
    // A new epoch (or id) starts every partition at sequence 0.
    this.sequences.clear();
  }

  beginTransaction() {
    this._checkUsable();
    if (this.producerId < 0n) throw new Error('call initTransactions() first');
    if (this.inTransaction) throw new Error('a transaction is already open');
    this.inTransaction = true;
    this.added.clear();
    this.abortableError = null;
  }

  /** AddPartitionsToTxn for partitions not yet in the transaction (one request for all). */
  async _addPartitions(partitions) {
    const missing = partitions.filter(([t, p]) => !this.added.has(partitionKey(t, p)));
    if (missing.length === 0) return;
    const response = await this._coordinatorCall('AddPartitionsToTxn', {
      transactional_id: this.transactionalId,
      producer_id: this.producerId.toString(),
      producer_epoch: this.producerEpoch,
      partitions: missing.map(([topic, partition]) => ({ topic, partition })),
    });
    for (const result of response.results) {
      const exc = errorFromProto(result.error);
      if (exc) {
        throw this._failIfFatal(new OncelogError(exc.code,
          `AddPartitionsToTxn ${result.partition.topic}-${result.partition.partition}: ` +
          exc.detail, exc.retriable));
      }
    }
    for (const [t, p] of missing) this.added.add(partitionKey(t, p));
  }

  /**
   * Encodes `records` as one transactional batch with the partition's next
   * sequence and writes it. Returns {baseOffset, duplicate, baseSequence,
   * batch}: `batch` is the exact bytes sent, so a caller may re-send them.
   */
  async send(topic, partition, records) {
    if (!this.inTransaction) throw new Error('call beginTransaction() first');
    this._checkCanCommit();
    const key = partitionKey(topic, partition);
    const baseSequence = this.sequences.get(key) ?? 0;
    const batch = encodeBatch(records, {
      producerId: this.producerId,
      producerEpoch: this.producerEpoch,
      baseSequence,
      transactional: true,
    });
    try {
      await this._addPartitions([[topic, partition]]);
      // The sequence is taken before the first attempt: a batch whose
      // outcome stays unknown may be in the log, and its sequence range must
      // never carry other records (the store would answer them `duplicate`).
      this.sequences.set(key, nextSequence(baseSequence, records.length));
      const result = await this.produceBatch(topic, partition, batch);
      return { ...result, baseSequence, batch };
    } catch (exc) {
      throw this._failTransaction(exc);
    }
  }

  /**
   * Writes an encoded batch, retrying retriable errors with the identical
   * bytes (same producer id, epoch and sequence): if an earlier attempt was
   * appended and only its answer was lost, the store recognises the batch as
   * one of the producer's last five and answers with its original offset
   * (`duplicate`), writing nothing.
   */
  async produceBatch(topic, partition, batch) {
    this._checkUsable();
    try {
      return await this.client.onPartition(`Produce to ${topic}-${partition}`, topic, partition,
        async (address, timeoutMs) => {
          const response = await this.client.unary('store', address, 'Produce', {
            batches: [{ topic, partition, batch }],
            timeout_ms: timeoutMs,
            transactional_id: this.transactionalId,
            // A second more than the store may take, so the store's own
            // REQUEST_TIMED_OUT answer arrives before our deadline.
          }, timeoutMs + 1000);
          const result = response.results.find(
            (r) => r.topic === topic && r.partition === partition);
          if (!result) {
            throw new OncelogError('UNKNOWN_SERVER_ERROR',
              `Produce answer has no result for ${topic}-${partition}`, false);
          }
          const exc = errorFromProto(result.error);
          if (exc && exc.code === 'DUPLICATE_SEQUENCE_NUMBER') {
            // Written before, at an offset the store no longer remembers.
            return { baseOffset: -1, duplicate: true };
          }
          if (exc) throw exc;
          return { baseOffset: Number(result.base_offset), duplicate: result.duplicate };
        }, { budgetMs: this.budgetMs });
    } catch (exc) {
      throw this._failIfFatal(exc);
    }
  }

  /**
   * EndTxn(commit | abort). Every retry sends the same request (same
   * producer id and epoch): the coordinator answers a retry whose first
   * answer was lost as it answered the first, so a commit whose outcome is
   * unknown is never turned into an abort. Returns the epoch the next
   * transaction uses.
   */
  async endTransaction(commit) {
    if (!this.inTransaction) throw new Error('no transaction is open');
    if (commit) this._checkCanCommit();
    else this._checkUsable();
    if (this.added.size > 0) {
      let response;
      try {
        response = await this._coordinatorCall('EndTxn', {
          transactional_id: this.transactionalId,
          producer_id: this.producerId.toString(),
          producer_epoch: this.producerEpoch,
          commit,
        });
      } catch (exc) {
        throw this._failUnlessTimedOut(exc);
      }
      this._setIdentity(response.producer_id, response.producer_epoch);
    }
    // With no partition added the coordinator knows of no transaction:
    // there is nothing to end, and the epoch stays.
    this.inTransaction = false;
    this.added.clear();
    this.abortableError = null;
    return this.producerEpoch;
  }

  commitTransaction() {
    return this.endTransaction(true);
  }

  abortTransaction() {
    return this.endTransaction(false);
  }
}

module.exports = { TransactionalProducer };
