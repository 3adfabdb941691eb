// Times tiktoken's `gpt2` encode_ordinary on a file (one thread: tiktoken's
// WebAssembly build has no threads). Prints {"mb_s": [...], "tokens": n,
// "fnv": h}, h being FNV-1a over the ids as 32-bit words (apiary's bench
// computes the same to check that the two encoders made the same ids).
//   node tiktoken_bench.mjs INPUT REPS
import { readFileSync } from "node:fs";
import { get_encoding } from "tiktoken";

const [input, repsArg] = process.argv.slice(2);
const reps = Number(repsArg ?? 3);
const enc = get_encoding("gpt2");
const text = readFileSync(input, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
const ids = enc.encode_ordinary(text);  // warm-up, and checked by the caller
let tokens = ids.length;
let fnv = 0x811c9dc5;
for (const id of ids) fnv = Math.imul(fnv ^ id, 0x01000193) >>> 0;
const mb_s = [];
for (let r = 0; r < reps; ++r) {
  const t0 = process.hrtime.bigint();
  tokens = enc.encode_ordinary(text).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  mb_s.push(bytes / 1e6 / s);
}
console.log(JSON.stringify({ mb_s, tokens, fnv }));
enc.free();
