// Encodes a file with Hugging Face's JavaScript tokenizers from a
// tokenizer.json and writes the ids as little-endian uint32.
//   node hf_encode.mjs TOKENIZER.json INPUT OUTPUT.u32
import { readFileSync, writeFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokenizerPath, input, output] = process.argv.slice(2);
const tok = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")), {});
const text = readFileSync(input, "utf8");
const { ids } = tok.encode(text, { add_special_tokens: false });
writeFileSync(output, Buffer.from(new Uint32Array(ids).buffer));
