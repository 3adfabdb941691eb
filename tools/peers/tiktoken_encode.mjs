// Encodes a file with tiktoken's `gpt2` encoding (the reference the data tests
// compare apiary's BPE against) and writes the ids as little-endian uint32.
//   node tiktoken_encode.mjs INPUT OUTPUT.u32
import { readFileSync, writeFileSync } from "node:fs";
import { get_encoding } from "tiktoken";

const [input, output] = process.argv.slice(2);
const enc = get_encoding("gpt2");
const text = readFileSync(input, "utf8");
const ids = enc.encode_ordinary(text);
writeFileSync(output, Buffer.from(new Uint32Array(ids).buffer));
enc.free();
