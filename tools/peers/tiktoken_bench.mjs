// Times tiktoken's `gpt2` encode_ordinary on a file (one thread: tiktoken's
// WebAssembly build has no threads). Prints {"mb_s": [...], "tokens": n}.
//   node tiktoken_bench.mjs INPUT REPS
import { readFileSync } from "node:fs";
import { get_encoding } from "tiktoken";

const [input, repsArg] = process.argv.slice(2);
const reps = Number(repsArg ?? 3);
const enc = get_encoding("gpt2");
const text = readFileSync(input, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
let tokens = enc.encode_ordinary(text).length;  // warm-up, and checked by the caller
const mb_s = [];
for (let r = 0; r < reps; ++r) {
  const t0 = process.hrtime.bigint();
  tokens = enc.encode_ordinary(text).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  mb_s.push(bytes / 1e6 / s);
}
console.log(JSON.stringify({ mb_s, tokens }));
enc.free();
