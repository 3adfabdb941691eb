#include "train/keys.h"

#include "comm/config.h"
#include "data/keys.h"
#include "obs/keys.h"

namespace apiary::train {

void add_keys(core::Schema& s) {
    comm::add_keys(s);  // the trainer reads comm.* (bucket size, timeouts)
    s.add_int("train.steps", 1400, "optimizer steps to run", 1, 1e12);
    s.add_real("train.lr", 2e-3, "peak learning rate", 0.0, 10.0);
    s.add_real("train.min_lr", 2e-4, "learning rate at the end of the cosine decay", 0.0, 10.0);
    s.add_int("train.warmup_steps", 100, "steps of linear warmup from 0 to train.lr", 0, 1e12);
    s.add_real("train.weight_decay", 0.1,
               "AdamW decoupled weight decay on matrices and embeddings (not norms, biases)", 0.0,
               10.0);
    s.add_real("train.beta1", 0.9, "AdamW first-moment decay", 0.0, 0.999999);
    s.add_real("train.beta2", 0.95, "AdamW second-moment decay", 0.0, 0.999999999);
    s.add_real("train.eps", 1e-8, "AdamW epsilon", 0.0, 1.0);
    s.add_string("train.lr_schedule_by", "steps",
                 "clock of the warmup and cosine decay: 'steps', or 'tokens' consumed (they "
                 "differ when a curriculum in batch mode varies the tokens per step; warmup then "
                 "lasts train.warmup_steps full-batch steps' worth of tokens)",
                 {"steps", "tokens"});
    s.add_real("train.grad_clip", 1.0, "clip the global gradient L2 norm to this (0: off)", 0.0,
               1e9);
    s.add_int("train.seed", 1337, "seed of initialisation (the data order has data.seed)", 0,
              9.2e18);
    s.add_int("train.eval_every", 200,
              "steps between evaluations on the held-out split (0: only "
              "at the end)",
              0, 1e12);
    s.add_int("train.eval_batches", 16, "micro-batches per evaluation", 1, 1e9);
    s.add_int("train.log_every", 10, "steps between progress lines and metrics.jsonl records", 1,
              1e12);
    s.add_int("train.threads", 0, "compute threads per rank (0: all cores this process may use)", 0,
              4096);
    s.add_int("train.ckpt_every", 0, "steps between checkpoints (0: only the final one)", 0, 1e12);
    s.add_int("train.ckpt_keep", 0,
              "checkpoints kept in ckpt/: older ones are removed after each save (0: keep all)", 0,
              1e9);
    s.add_bool("train.ckpt_async", false,
               "write checkpoints in a background thread: the step only copies this rank's part "
               "aside (at most one save in flight)");
    s.add_bool("train.ckpt_incremental", false,
               "store checkpoints as content-addressed pieces in ckpt/blobs: a save writes only "
               "the pieces that changed since a kept checkpoint (frozen layers, fine-tuning)");
    s.add_real("train.ckpt_piece_mb", 4.0, "size of an incremental checkpoint's pieces, in MiB",
               0.001, 1e4);
    s.add_real("train.ckpt_mtbf_hours", 0.0,
               "mean time between failures of the job's machines: with it, the optimal "
               "checkpoint interval (Young/Daly, from the measured save cost) is logged after "
               "the first save",
               0.0, 1e9);
    s.add_bool("train.ckpt_every_auto", false,
               "with train.ckpt_mtbf_hours: save at that optimal interval instead of "
               "train.ckpt_every");
    s.add_string("train.freeze", "",
                 "parameters not trained: comma-separated prefixes of their names, e.g. "
                 "\"wte.,h.0.,h.1.\" (fine-tuning)");
    s.add_bool("train.rollback", false,
               "on a non-finite loss or gradient norm, or a loss spike (train.spike_zscore), "
               "roll back to the last checkpoint and skip the offending batch (recorded in "
               "later checkpoints, so a resume skips it too)");
    s.add_real("train.spike_zscore", 0.0,
               "a loss this many standard deviations above the mean of the last "
               "train.spike_window steps is a spike (0: only non-finite values are)",
               0.0, 1e9);
    s.add_int("train.spike_window", 50, "steps the loss spike statistics are taken over", 2, 1e9);
    s.add_int("train.max_rollbacks", 3, "rollbacks before the run stops with an error", 0, 1e9);
    s.add_bool("train.elastic", false,
               "resuming on another number of data-parallel ranks keeps the global batch by "
               "scaling train.grad_accum (as `apiary launch --min-ranks` restarts need)");

    s.add_real("train.loss_scale_init", 65536.0, "fp16: initial dynamic loss scale", 1.0, 1e30);
    s.add_int("train.loss_scale_growth_interval", 1000,
              "fp16: clean steps before the loss scale doubles", 1, 1e12);
    s.add_real("train.loss_scale_min", 1.0,
               "fp16: the run stops with an error if the loss scale falls below this", 1e-30, 1e30);
    s.add_string("debug.inject_overflow_steps", "",
                 "testing hook: comma-separated batches (1-based loader batch numbers: the step "
                 "unless batches were skipped) whose gradients are made non-finite, to exercise "
                 "the overflow and rollback paths");

    s.add_string("data.corpus", "kjv",
                 "training text when data.sources is empty: 'kjv' (the King James Bible from "
                 "Debian's bible-kjv-text, dumped by its `bible` command) or the path of a text "
                 "file; tokenized by data.tokenizer and prepared into shards in data.cache_dir");
    s.add_string("data.tokenizer", "bpe",
                 "tokenizer of data.corpus: 'bpe' (data.tokenizer_file if set, else a byte-level "
                 "BPE of data.bpe_vocab_size tokens trained on the corpus) or 'byte' (the 256 "
                 "bytes and <|endoftext|>)",
                 {"bpe", "byte"});
    s.add_int("data.bpe_vocab_size", 2048,
              "tokens of the BPE trained on data.corpus (256 bytes + merges + <|endoftext|>); "
              "the model's vocabulary follows unless model.vocab_size is set",
              257, 1 << 20);
    s.add_real("data.val_fraction", 0.05,
               "fraction of data.corpus held out for evaluation (units of at most 64 KiB, spread "
               "over the text)",
               0.001, 0.5);
    data::add_keys(s);  // the loader's data.* (sources, shuffle, curriculum, ...)

    obs::add_keys(s);  // metrics.*, health.*, profile.*

    s.add_string("run.dir", "runs/default",
                 "run directory: config.toml, metrics.jsonl, ckpt/ (must be new or empty unless "
                 "--overwrite)");
}

}  // namespace apiary::train
