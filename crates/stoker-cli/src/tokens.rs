//! `stoker tokens`: packed language-model batches from any source, as a training job's rank
//! would read them (`stoker::tokens::TokenLoader`), with tokens/s, this rank's `input_ids`
//! written out on request, and the resume state saved and loaded: what the Python
//! `TokenLoader` does, from the shell.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use stoker::sampler::Partition;
use stoker::tokens::{IdType, PackConfig, Packing, TextInput, TextTokenizer, TokenLoader, TokenState};

use crate::error::{Context, Result};

/// Arguments of `stoker tokens`.
#[derive(Args)]
#[command(after_help = "Examples:\n  \
stoker tokens ./megatron-corpus --seq-len 2048 --global-batch 64\n  \
stoker tokens ./web.jsonl.zst --tokenizer tokenizer.json --eos '<|endoftext|>' --seq-len 2048 --shuffle\n  \
stoker tokens corpora.mix.toml --seq-len 4096 --global-batch 32 --json      # weighted by tokens\n  \
stoker tokens ./corpus --seq-len 1024 --batches 100 --save-state s.json      # stop, then:\n  \
stoker tokens ./corpus --seq-len 1024 --resume s.json --rank 1 --world-size 4 --dump rank1.bin")]
pub(crate) struct TokensArgs {
    #[command(flatten)]
    source: crate::SourceArgs,
    /// Tokens per sequence.
    #[arg(long)]
    seq_len: usize,
    /// Sequences per global batch, over all ranks (a multiple of --world-size).
    #[arg(long, default_value_t = 8)]
    global_batch: usize,
    /// A `tokenizer.json` for a text source (JSONL, Parquet/MDS/LitData text columns, `.txt`
    /// files and members); text is tokenized once into the user cache and reused.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// The field holding the text or the ids, when samples have several.
    #[arg(long)]
    field: Option<String>,
    /// Pack a document that cannot be read or tokenized as empty, with a warning.
    #[arg(long)]
    skip_errors: bool,
    /// Rows of seq_len + 1 tokens: inputs and shifted labels in one row.
    #[arg(long)]
    labels: bool,
    /// Token put before every document: an id, or a token of --tokenizer.
    #[arg(long, value_name = "ID|TOKEN")]
    bos: Option<String>,
    /// Token put after every document: an id, or a token of --tokenizer.
    #[arg(long, value_name = "ID|TOKEN")]
    eos: Option<String>,
    /// Token that fills padding.
    #[arg(long, default_value_t = 0)]
    pad_id: i64,
    /// Pad the epoch's last partial sequence and global batch instead of dropping them.
    #[arg(long)]
    pad_tail: bool,
    /// One document per sequence, truncated or padded (fine-tuning), instead of packing.
    #[arg(long)]
    per_document: bool,
    /// int64 `input_ids` (int32 by default); the same as --ids-dtype int64.
    #[arg(long, conflicts_with = "ids_dtype")]
    int64: bool,
    /// The integer type of `input_ids`: int32 (the default), int64, or uint16 (vocabularies
    /// of at most 65,536 tokens: half the bytes of int32).
    #[arg(long, value_name = "DTYPE")]
    ids_dtype: Option<String>,
    /// `loss_mask` 0 on each document's first token after another document in its row.
    #[arg(long)]
    mask_boundaries: bool,
    /// The columns each batch carries, input_ids among them [default: input_ids,
    /// position_ids,loss_mask,cu_seqlens]: the others are neither computed nor copied.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    columns: Option<Vec<String>>,
    #[command(flatten)]
    shuffle: crate::shuffle::ShuffleArgs,
    /// Seed of the shuffles.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// This process's rank [default: $RANK, else 0].
    #[arg(long)]
    rank: Option<u64>,
    /// Ranks sharing each global batch [default: $WORLD_SIZE, else 1].
    #[arg(long)]
    world_size: Option<u64>,
    /// Epochs to read (from the resumed one on).
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Stop after this many global batches (in all), e.g. to save a state mid-epoch.
    #[arg(long)]
    batches: Option<u64>,
    /// Global batches read ahead.
    #[arg(long, default_value_t = 4)]
    prefetch: usize,
    /// Resume from a state written by --save-state (at any world size).
    #[arg(long, value_name = "FILE")]
    resume: Option<PathBuf>,
    /// Write the resume state when the run stops.
    #[arg(long, value_name = "FILE")]
    save_state: Option<PathBuf>,
    /// Write this rank's `input_ids` to FILE, batch after batch, row after row, as the
    /// machine's integers of the ids' type (int32, or as --ids-dtype says): `numpy.fromfile`
    /// reads it back.
    #[arg(long, value_name = "FILE")]
    dump: Option<PathBuf>,
    /// Print JSON lines (one per epoch) instead of text.
    #[arg(long)]
    json: bool,
}

impl TokensArgs {
    fn config(&self, vocab: Option<&TextTokenizer>) -> Result<PackConfig> {
        // A special token by its text (`--eos '<|endoftext|>'`) needs the tokenizer.
        let id = |what: &str, v: &Option<String>| -> Result<Option<i64>> {
            let Some(v) = v else { return Ok(None) };
            if let Ok(i) = v.parse::<i64>() {
                return Ok(Some(i));
            }
            match vocab {
                Some(tok) => Ok(Some(i64::from(
                    tok.token_id(v).ok_or_else(|| format!("--{what} {v:?} is not a token of the tokenizer"))?,
                ))),
                None => Err(format!("--{what} {v:?}: a token by its text needs --tokenizer").into()),
            }
        };
        let mut cfg = PackConfig::new(self.seq_len, self.global_batch);
        cfg.labels = self.labels;
        cfg.order = self.shuffle.order(self.seed)?;
        cfg.bos = id("bos", &self.bos)?;
        cfg.eos = id("eos", &self.eos)?;
        cfg.pad_id = self.pad_id;
        cfg.pad_tail = self.pad_tail;
        cfg.packing = if self.per_document { Packing::PerDocument } else { Packing::Concat };
        cfg.ids = match (&self.ids_dtype, self.int64) {
            (Some(name), _) => IdType::from_name(name)?,
            (None, true) => IdType::Int64,
            (None, false) => IdType::Int32,
        };
        cfg.mask_boundaries = self.mask_boundaries;
        if let Some(names) = &self.columns {
            cfg.columns = stoker::tokens::TokenColumns::from_names(names)?;
        }
        cfg.prefetch = self.prefetch;
        let env = Partition::from_env().map_err(|e| format!("RANK/WORLD_SIZE: {e}"))?;
        let (rank, world) = (self.rank.unwrap_or(env.rank), self.world_size.unwrap_or(env.world_size));
        cfg.partition = Partition::new(rank, world).map_err(|e| format!("--rank/--world-size: {e}"))?;
        Ok(cfg)
    }
}

pub(crate) async fn run(args: TokensArgs) -> Result<()> {
    let vocab = match &args.tokenizer {
        Some(p) => Some(Arc::new(TextTokenizer::from_file(p)?)),
        None => None,
    };
    let cfg = args.config(vocab.as_deref())?;
    let resume: Option<TokenState> = match &args.resume {
        Some(p) => {
            let text = stoker::store::read_capped(p, stoker::store::SMALL_FILE_BYTES)
                .with_context(|| format!("cannot read {}", p.display()))?;
            Some(
                serde_json::from_slice(&text)
                    .with_context(|| format!("{} is not a token loader state", p.display()))?,
            )
        }
        None => None,
    };
    let src = args.source.open().await?;
    let text = TextInput { tokenizer: vocab, field: args.field.clone(), skip_errors: args.skip_errors };
    let loader = TokenLoader::open(src, &text, cfg.clone()).await?;
    let first = match resume {
        // The loader's reading of it: a state at an epoch's end resumes at the next one.
        Some(s) => {
            loader.load_state(s)?;
            loader.state().epoch
        }
        None => 0,
    };
    let mut dump = match &args.dump {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => None,
    };
    let mut left = args.batches.unwrap_or(u64::MAX);
    let row_tokens = (cfg.rows() * cfg.window()) as u64;
    let Some(end) = first.checked_add(args.epochs.max(1)) else {
        return Err(crate::CliError::Message(format!(
            "the state resumes in epoch {first}, past the last there can be"
        )));
    };
    for epoch in first..end {
        if left == 0 {
            break;
        }
        let mut run = loader.epoch(epoch)?;
        let (started, mut batches, mut waited) = (Instant::now(), 0u64, 0f64);
        loop {
            if left == 0 {
                break;
            }
            let asked = Instant::now();
            let Some(batch) = run.next_batch().await else { break };
            waited += asked.elapsed().as_secs_f64();
            let batch = batch?;
            if let Some(out) = dump.as_mut() {
                let ids = batch.field("input_ids").ok_or("a token batch without input_ids")?;
                for i in 0..ids.len() {
                    out.write_all(ids.get(i).unwrap_or_default()).context("writing --dump")?;
                }
            }
            (batches, left) = (batches + 1, left - 1);
        }
        let secs = started.elapsed().as_secs_f64();
        let tokens = batches * row_tokens;
        let per_s = tokens as f64 / secs.max(1e-9);
        let sources: serde_json::Map<String, serde_json::Value> =
            loader.source_tokens().into_iter().map(|(n, t)| (n, t.into())).collect();
        let p = cfg.partition;
        if args.json {
            let line = serde_json::json!({
                "epoch": epoch, "global_batches": batches, "tokens": tokens, "seconds": secs,
                "tokens_per_s": per_s, "wait_fraction": waited / secs.max(1e-9),
                "rank": p.rank, "world_size": p.world_size, "rows": cfg.rows(), "window": cfg.window(),
                "source_tokens": sources,
            });
            println!("{line}");
        } else {
            println!(
                "epoch {epoch}: {batches} global batches, {tokens} tokens for rank {} of {} ({} rows of {}) in \
                 {secs:.2} s: {:.2} M tokens/s, waiting {:.0}% of the time",
                p.rank,
                p.world_size,
                cfg.rows(),
                cfg.window(),
                per_s / 1e6,
                100.0 * waited / secs.max(1e-9)
            );
            for (name, t) in &sources {
                println!("  source {name}: {t} tokens");
            }
        }
    }
    if let Some(out) = dump.as_mut() {
        out.flush().context("writing --dump")?;
    }
    if let Some(p) = &args.save_state {
        let state = serde_json::to_vec_pretty(&loader.state()).context("the state")?;
        std::fs::write(p, state).with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}
