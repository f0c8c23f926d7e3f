// Reference GPT-2 encoder for the tests: the gpt-3-encoder package's own Encoder.js.
// usage: node gpt2_encode.js PACKAGE_DIR INPUT.jsonl OUTPUT.jsonl
// Each input line is a JSON string; each output line the JSON array of its ids.
'use strict';
const fs = require('fs');
const path = require('path');
const [pkg, input, output] = process.argv.slice(2);
const { encode } = require(path.resolve(pkg, 'Encoder.js'));
const lines = fs.readFileSync(input, 'utf-8').split('\n').filter((l) => l.length > 0);
const out = lines.map((l) => JSON.stringify(encode(JSON.parse(l))));
fs.writeFileSync(output, out.join('\n') + '\n');
