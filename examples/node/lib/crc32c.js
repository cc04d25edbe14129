'use strict';
// CRC32C (Castagnoli), the checksum of oncelog's record batches.
//
// Plain JavaScript on purpose: the example needs no native module, so it runs
// wherever Node runs. Table-driven, one byte at a time: fast enough for a
// client that encodes batches of kilobytes. Reflected polynomial 0x82F63B78,
// initial value and final XOR 0xFFFFFFFF (the same function as Python's
// crc32c package and Kafka's record batch v2).

const POLYNOMIAL_REFLECTED = 0x82f63b78;

const TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) {
      c = c & 1 ? (c >>> 1) ^ POLYNOMIAL_REFLECTED : c >>> 1;
    }
    table[n] = c >>> 0;
  }
  return table;
})();

/**
 * CRC32C of `bytes` as an unsigned 32-bit integer.
 * @param {Uint8Array} bytes
 * @returns {number}
 */
function crc32c(bytes) {
  let crc = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) {
    crc = TABLE[(crc ^ bytes[i]) & 0xff] ^ (crc >>> 8);
  }
  return (crc ^ 0xffffffff) >>> 0;
}

module.exports = { crc32c };
