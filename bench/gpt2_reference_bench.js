// Times the reference GPT-2 encoder (gpt-3-encoder's Encoder.js) on a JSON-lines file of
// strings, one encode() call per line; prints "<bytes> <seconds> <tokens>".
'use strict';
const fs = require('fs');
const path = require('path');
const [pkg, input] = process.argv.slice(2);
const { encode } = require(path.resolve(pkg, 'Encoder.js'));
const texts = fs.readFileSync(input, 'utf-8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
let bytes = 0, tokens = 0;
for (const t of texts) bytes += Buffer.byteLength(t, 'utf-8');
const t0 = process.hrtime.bigint();
for (const t of texts) tokens += encode(t).length;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(`${bytes} ${s} ${tokens}`);
