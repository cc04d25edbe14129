'use strict';
// The cluster client: the protos loaded at run time, one channel per address,
// oncelog's Error read out of every failure, and the retry loop.
//
// Nothing here is generated: @grpc/proto-loader reads protos/oncelog/v1/*.proto
// when the program starts, and protobufjs decodes the google.rpc.Status that
// carries a request-level error (docs/grpc-api.md, "Errors").
//
// A secured cluster (docs/security.md): the channels use TLS when the
// environment says so, with the CLI's variables (docs/cli.md):
// ONCELOG_SSL_CAFILE (the CA bundle that signed the cluster's certificates),
// ONCELOG_SSL_CERTFILE and ONCELOG_SSL_KEYFILE (a client certificate: the
// principal under mutual TLS), ONCELOG_SASL_OAUTH_TOKEN_FILE (a bearer
// token, sent as `authorization: Bearer <token>` with every call and read
// again from the file for each call) and ONCELOG_SECURITY_PROTOCOL
// (PLAINTEXT, SSL or SASL_SSL; by default SSL when a TLS file is given,
// SASL_SSL when a token file is, else PLAINTEXT).

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const DEFAULT_PROTO_DIR = path.resolve(__dirname, '..', '..', '..', 'protos');
const ERROR_TYPE_URL = 'type.googleapis.com/oncelog.v1.Error';
const STATUS_DETAILS_TRAILER = 'grpc-status-details-bin';
// The standard google.rpc.Status (googleapis, google/rpc/status.proto): the
// three fields are all a client needs; declared here rather than vendored.
const RPC_STATUS_PROTO = `
syntax = "proto3";
package google.rpc;
import "google/protobuf/any.proto";
message Status {
  int32 code = 1;
  string message = 2;
  repeated google.protobuf.Any details = 3;
}`;

// Channel options, as the Python SDK's: a Produce or Fetch message may carry
// 64 MiB (gRPC's default receive limit is 4 MiB, less than one batch may be),
// and a restarted store is dialled again within a second.
const CHANNEL_OPTIONS = {
  'grpc.max_send_message_length': 64 * 1024 * 1024,
  'grpc.max_receive_message_length': 64 * 1024 * 1024,
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 1000,
};

// Backoff between retries of a retriable error (as the Python SDK's
// retry_backoff_ms / retry_backoff_max_ms defaults).
const RETRY_BACKOFF_MS = 100;
const RETRY_BACKOFF_MAX_MS = 1000;
// CONCURRENT_TRANSACTIONS ends within milliseconds (markers of the previous
// transaction in flight): 2 ms, doubling up to 20 ms (Kafka waits 20 ms).
const CONCURRENT_TRANSACTIONS_BACKOFF_MS = 2;
const CONCURRENT_TRANSACTIONS_BACKOFF_MAX_MS = 20;

// After these the transactional id's coordinator may be another process:
// find it again before the retry.
const COORDINATOR_MOVED = new Set([
  'NOT_COORDINATOR', 'COORDINATOR_NOT_AVAILABLE', 'COORDINATOR_LOAD_IN_PROGRESS',
  'NETWORK_EXCEPTION', 'REQUEST_TIMED_OUT',
]);
// After these the partition's store may have changed: ask Metadata again.
const LEADER_MOVED = new Set([
  'NOT_LEADER_OR_FOLLOWER', 'LEADER_NOT_AVAILABLE', 'NETWORK_EXCEPTION',
  // Replicated partitions: a leader epoch other than the replica's means the
  // metadata is stale (docs/replication.md); a timeout, that the node may be
  // paused while its partitions moved.
  'FENCED_LEADER_EPOCH', 'UNKNOWN_LEADER_EPOCH', 'REQUEST_TIMED_OUT',
]);
// A transactional producer that gets one of these can never go on: another
// instance owns the transactional id now (or the coordinator aborted the
// transaction on its timeout and bumped the epoch), or the log lost data.
const FATAL_CODES = new Set([
  'PRODUCER_FENCED', 'INVALID_PRODUCER_EPOCH', 'INVALID_PRODUCER_ID_MAPPING',
  'TRANSACTION_COORDINATOR_FENCED', 'OUT_OF_ORDER_SEQUENCE_NUMBER',
]);

/** oncelog's Error (errors.proto) as an exception. `code` is the ErrorCode's name. */
class OncelogError extends Error {
  constructor(code, message, retriable) {
    super(`${code}: ${message}`);
    this.name = 'OncelogError';
    this.code = code;
    this.retriable = Boolean(retriable);
    this.detail = message;
  }

  get fatal() {
    return FATAL_CODES.has(this.code);
  }
}

/** An oncelog.v1.Error decoded with enums as names; null when it is NONE. */
function errorFromProto(err) {
  if (!err) return null;
  let code = err.code;
  if (code === 'NONE' || code === 0 || code === undefined || code === null) return null;
  // The set is closed: a number this copy of the protos does not know is
  // treated as UNKNOWN_SERVER_ERROR (errors.proto).
  if (typeof code !== 'string') code = 'UNKNOWN_SERVER_ERROR';
  return new OncelogError(code, err.message || code, err.retriable);
}

// How a failure without our Error in its details (a transport failure, a
// proxy, a crashed server) is read: the same mapping as sdk/oncelog/_status.py.
const BARE_STATUS = new Map([
  [grpc.status.UNAVAILABLE, ['NETWORK_EXCEPTION', true]],
  [grpc.status.CANCELLED, ['NETWORK_EXCEPTION', true]],
  [grpc.status.DEADLINE_EXCEEDED, ['REQUEST_TIMED_OUT', true]],
  [grpc.status.RESOURCE_EXHAUSTED, ['MESSAGE_TOO_LARGE', false]],
]);

const SECURITY_PROTOCOLS = new Set(['PLAINTEXT', 'SSL', 'SASL_SSL']);

/** A PEM file named by an environment variable, read now; null when unset. */
function pemFromEnv(env, name) {
  const file = env[name];
  if (!file) return null;
  let data;
  try {
    data = fs.readFileSync(file);
  } catch (exc) {
    throw new Error(`${name}: cannot read ${file}: ${exc.message}`);
  }
  if (!data.includes('-----BEGIN ')) throw new Error(`${name}: ${file} is not a PEM file`);
  return data;
}

/**
 * The channel credentials the environment asks for (see the top of this
 * file): insecure, TLS, or TLS with a bearer token on every call. A setting
 * that cannot work is an Error naming the variable.
 */
function credentialsFromEnv(env = process.env) {
  const ca = pemFromEnv(env, 'ONCELOG_SSL_CAFILE');
  const cert = pemFromEnv(env, 'ONCELOG_SSL_CERTFILE');
  const key = pemFromEnv(env, 'ONCELOG_SSL_KEYFILE');
  const tokenFile = env.ONCELOG_SASL_OAUTH_TOKEN_FILE || null;
  const protocol = (env.ONCELOG_SECURITY_PROTOCOL
    || (tokenFile ? 'SASL_SSL' : (ca || cert || key) ? 'SSL' : 'PLAINTEXT')).toUpperCase();
  if (!SECURITY_PROTOCOLS.has(protocol)) {
    throw new Error(`ONCELOG_SECURITY_PROTOCOL must be PLAINTEXT, SSL or SASL_SSL, got ${protocol}`);
  }
  if (protocol === 'PLAINTEXT') {
    if (ca || cert || key) {
      throw new Error('ONCELOG_SSL_* is set, but ONCELOG_SECURITY_PROTOCOL is PLAINTEXT');
    }
    return grpc.credentials.createInsecure();
  }
  if (Boolean(cert) !== Boolean(key)) {
    throw new Error('ONCELOG_SSL_CERTFILE and ONCELOG_SSL_KEYFILE go together: a client ' +
      'certificate needs its private key');
  }
  if ((protocol === 'SASL_SSL') !== Boolean(tokenFile)) {
    throw new Error('ONCELOG_SECURITY_PROTOCOL=SASL_SSL and ONCELOG_SASL_OAUTH_TOKEN_FILE go ' +
      'together (a bearer token is sent over TLS only)');
  }
  const tls = grpc.credentials.createSsl(ca, key, cert);
  if (!tokenFile) return tls;
  const bearer = grpc.credentials.createFromMetadataGenerator((_params, callback) => {
    let token;
    try {
      token = fs.readFileSync(tokenFile, 'utf8').trim();
    } catch (exc) {
      callback(new Error(`ONCELOG_SASL_OAUTH_TOKEN_FILE: cannot read ${tokenFile}: ${exc.message}`));
      return;
    }
    const metadata = new grpc.Metadata();
    metadata.set('authorization', `Bearer ${token}`);
    callback(null, metadata);
  });
  return grpc.credentials.combineChannelCredentials(tls, bearer);
}

function backoffMs(attempt, baseMs, maxMs) {
  return Math.min(maxMs, baseMs * 2 ** Math.min(Math.max(attempt - 1, 0), 20));
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

class ClusterClient {
  /**
   * @param {string} bootstrap host:port of any partition store
   * @param {{protoDir?: string, requestTimeoutMs?: number,
   *          credentials?: grpc.ChannelCredentials}} [options] credentials:
   *   default from the environment (credentialsFromEnv)
   */
  constructor(bootstrap, options = {}) {
    if (typeof bootstrap !== 'string' || !/^[^:]+:\d+$/.test(bootstrap)) {
      throw new Error(`bootstrap must be host:port, got ${JSON.stringify(bootstrap)}`);
    }
    this.bootstrap = bootstrap;
    this.requestTimeoutMs = options.requestTimeoutMs ?? 30000;
    this._credentials = options.credentials ?? credentialsFromEnv();
    const protoDir = options.protoDir ?? DEFAULT_PROTO_DIR;
    const loaderOptions = {
      includeDirs: [protoDir],
      // Field names as in the protos; int64 as decimal strings (exact, turned
      // into BigInt or checked numbers where used); enums by name.
      keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
    };
    const definition = protoLoader.loadSync(
      ['oncelog/v1/partition_store.proto', 'oncelog/v1/coordinator.proto'], loaderOptions);
    const v1 = grpc.loadPackageDefinition(definition).oncelog.v1;
    this._services = { store: v1.PartitionStore, coordinator: v1.TransactionCoordinator };
    const root = new protobuf.Root();
    root.loadSync(path.join(protoDir, 'oncelog', 'v1', 'errors.proto'), { keepCase: true });
    // google.protobuf.Any ships with protobufjs; Status is declared above.
    root.addJSON(protobuf.common.get('google/protobuf/any.proto').nested);
    protobuf.parse(RPC_STATUS_PROTO, root, { keepCase: true });
    root.resolveAll();
    this._errorType = root.lookupType('oncelog.v1.Error');
    this._statusType = root.lookupType('google.rpc.Status');
    this._stubs = new Map();
    this._metadata = null;
    // Counts of retried errors by code, for the caller's report.
    this.retries = {};
  }

  close() {
    for (const stub of this._stubs.values()) stub.close();
    this._stubs.clear();
  }

  _stub(kind, address) {
    const key = `${kind}@${address}`;
    let stub = this._stubs.get(key);
    if (!stub) {
      stub = new this._services[kind](address, this._credentials, CHANNEL_OPTIONS);
      this._stubs.set(key, stub);
    }
    return stub;
  }

  /**
   * One RPC: resolves with the response, rejects with an OncelogError.
   * @param {'store'|'coordinator'} kind
   */
  unary(kind, address, method, request, timeoutMs = this.requestTimeoutMs) {
    const stub = this._stub(kind, address);
    return new Promise((resolve, reject) => {
      stub[method](request, { deadline: Date.now() + timeoutMs }, (err, response) => {
        if (err) reject(this.errorFromRpc(err, `${method} at ${address}`));
        else resolve(response);
      });
    });
  }

  /**
   * Our Error from a failed call: from the google.rpc.Status in the
   * grpc-status-details-bin trailer when there is one, else mapped from the
   * bare gRPC status code.
   */
  errorFromRpc(err, what) {
    const raw = err.metadata ? err.metadata.get(STATUS_DETAILS_TRAILER) : [];
    for (const bytes of raw) {
      const status = this._statusType.decode(bytes);
      for (const detail of status.details) {
        if (detail.type_url === ERROR_TYPE_URL) {
          const decoded = this._errorType.toObject(this._errorType.decode(detail.value),
            { enums: String });
          const exc = errorFromProto(decoded);
          if (exc) return exc;
        }
      }
    }
    const [code, retriable] = BARE_STATUS.get(err.code) ?? ['UNKNOWN_SERVER_ERROR', false];
    return new OncelogError(code, `${what}: gRPC status ${err.code}: ${err.details}`, retriable);
  }

  /**
   * Runs `attempt()` until it resolves, retrying retriable OncelogErrors with
   * backoff until `budgetMs` has passed. `onRetry(error)` runs before each
   * pause (to forget a coordinator or refresh metadata). Non-retriable errors
   * are thrown as they come.
   */
  async withRetries(what, attempt, { budgetMs = this.requestTimeoutMs, onRetry } = {}) {
    const deadline = Date.now() + budgetMs;
    let attempts = 0;
    let concurrent = 0;
    for (;;) {
      attempts += 1;
      try {
        return await attempt(Math.max(1, Math.min(this.requestTimeoutMs, deadline - Date.now())));
      } catch (exc) {
        if (!(exc instanceof OncelogError) || !exc.retriable) throw exc;
        this.retries[exc.code] = (this.retries[exc.code] ?? 0) + 1;
        if (onRetry) onRetry(exc);
        let pauseMs;
        if (exc.code === 'CONCURRENT_TRANSACTIONS') {
          concurrent += 1;
          pauseMs = backoffMs(concurrent, CONCURRENT_TRANSACTIONS_BACKOFF_MS,
            CONCURRENT_TRANSACTIONS_BACKOFF_MAX_MS);
        } else {
          pauseMs = backoffMs(attempts, RETRY_BACKOFF_MS, RETRY_BACKOFF_MAX_MS);
        }
        if (Date.now() + pauseMs >= deadline) {
          throw new OncelogError('REQUEST_TIMED_OUT',
            `${what} did not succeed within ${budgetMs} ms; last error: ${exc.message}`, true);
        }
        await sleep(pauseMs);
      }
    }
  }

  /** Metadata from the bootstrap store (cached until `refresh`). */
  async metadata({ refresh = false } = {}) {
    if (this._metadata && !refresh) return this._metadata;
    const response = await this.withRetries('Metadata', (timeoutMs) =>
      this.unary('store', this.bootstrap, 'Metadata', { include_internal: false }, timeoutMs));
    const stores = new Map(response.stores.map((n) => [n.node_id, n.address]));
    const topics = new Map();
    for (const t of response.topics) {
      if (errorFromProto(t.error)) continue;
      topics.set(t.name, new Map(t.partitions.map((p) => [p.partition, p.leader_node_id])));
    }
    this._metadata = {
      stores,
      coordinators: response.coordinators.map((n) => n.address),
      topics,
    };
    return this._metadata;
  }

  /** The address of the store that owns a partition. */
  async leader(topic, partition) {
    let md = await this.metadata();
    if (!md.topics.has(topic)) md = await this.metadata({ refresh: true });
    const partitions = md.topics.get(topic);
    if (!partitions) {
      throw new OncelogError('UNKNOWN_TOPIC_OR_PARTITION',
        `topic ${JSON.stringify(topic)} does not exist; create it first`, false);
    }
    if (!partitions.has(partition)) {
      throw new OncelogError('UNKNOWN_TOPIC_OR_PARTITION',
        `topic ${JSON.stringify(topic)} has ${partitions.size} partitions, no partition ${partition}`,
        false);
    }
    const address = md.stores.get(partitions.get(partition));
    if (!address) {
      throw new OncelogError('LEADER_NOT_AVAILABLE',
        `${topic}-${partition} is owned by store node ${partitions.get(partition)}, ` +
        'which Metadata does not list', true);
    }
    return address;
  }

  /**
   * A partition call with retries: `attempt(address, timeoutMs)` against the
   * partition's current leader; metadata is refreshed after errors that say
   * the leader may have moved.
   */
  async onPartition(what, topic, partition, attempt, options = {}) {
    return this.withRetries(what, async (timeoutMs) =>
      attempt(await this.leader(topic, partition), timeoutMs), {
      ...options,
      onRetry: (exc) => {
        if (LEADER_MOVED.has(exc.code)) this._metadata = null;
      },
    });
  }
}

module.exports = {
  COORDINATOR_MOVED,
  ClusterClient,
  credentialsFromEnv,
  FATAL_CODES,
  OncelogError,
  errorFromProto,
};
