//! `stoker pack`: convert any source into WebDataset tar shards or an LMDB.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use clap::{Args, ValueEnum};
use indicatif::ProgressBar;
use stoker::pack::{PackOptions, PackProgress};
use stoker::Layout;

use crate::error::{CliError, Result};
use crate::units::parse_size;
use crate::{human_bytes, human_duration, write_result, SourceArgs};

#[derive(Clone, Copy, ValueEnum)]
enum PackLayout {
    /// WebDataset tar shards, with sidecar indexes and a manifest.
    Tar,
    /// One LMDB environment (data.mdb); one field per sample.
    Lmdb,
    /// A Megatron indexed dataset (NAME-00000.bin + .idx, ...) of the text tokenized with
    /// --tokenize, or without it of arrays of ids (MDS ndarray columns, Parquet integer
    /// lists): what Megatron-LM, NeMo and `stoker.TokenLoader` read.
    Tokens,
}

/// Arguments of `stoker pack`.
#[derive(Args)]
#[command(after_help = "Examples:\n  \
stoker pack ./images ./shards --group --prefix train\n  \
stoker pack 's3://bucket/raw?endpoint=http://127.0.0.1:9000' s3://bucket/shards --shard-size 1GiB\n  \
stoker pack ./images ./lmdb --layout lmdb --field jpg\n  \
stoker pack ./corpus.jsonl.zst ./tokens --layout tokens --tokenize tokenizer.json --append-eos '<|endoftext|>'\n\n\
Rerunning the same command after an interruption finishes the job and keeps the shards already written.")]
pub(crate) struct PackArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Where to write: a local directory (created if missing) or, for tar, a remote prefix
    /// such as s3://bucket/shards (options in its query, as for sources).
    dest: String,
    /// Output layout.
    #[arg(long, value_enum, default_value = "tar")]
    layout: PackLayout,
    /// Tar: close a shard before it would pass this size (units: B, KiB, MiB, GiB, KB, MB, GB).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    shard_size: u64,
    /// Tar: at most this many samples per shard.
    #[arg(long, value_name = "N")]
    samples_per_shard: Option<usize>,
    /// Tar: shard names are PREFIX-000000.tar, PREFIX-000001.tar, ...
    #[arg(long, default_value = "shard")]
    prefix: String,
    /// Merge samples sharing a key (0001.jpg + 0001.cls) into one sample with several fields.
    /// Without it each source sample stays one sample, and two in a row with one key are an
    /// error (a tar reader would merge them).
    #[arg(long)]
    group: bool,
    /// Keep only this field of each sample (LMDB holds one value per key: needed when samples
    /// have several fields).
    #[arg(long, value_name = "NAME")]
    field: Option<String>,
    /// Tokens: the Hugging Face tokenizer.json that tokenizes the text (field --field, or the
    /// samples' only field; JSONL's is its text_field, `text` by default).
    #[arg(long, value_name = "TOKENIZER_JSON")]
    tokenize: Option<std::path::PathBuf>,
    /// Tokens: a token appended to every document (an id, or a token of the vocabulary such
    /// as '<|endoftext|>'), as Megatron's --append-eod.
    #[arg(long, value_name = "ID_OR_TOKEN")]
    append_eos: Option<String>,
    /// Tokens: documents per part file (a rerun after an interruption redoes at most one part).
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    documents_per_part: u64,
    /// Tokens: write a document whose bytes are bad (a JSONL line that is not JSON or lacks the
    /// field, text that is not UTF-8) empty, and list it in the summary, instead of stopping.
    #[arg(long)]
    skip_errors: bool,
    /// Shards written at once.
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// Write into a destination that holds another dataset (an earlier pack's files are
    /// replaced).
    #[arg(long)]
    force: bool,
    /// Tokens with --ray: the type of the ids written, `uint16` (Megatron's for vocabularies up
    /// to 65,535 ids) or `int32`.
    #[arg(long, default_value = "uint16", value_parser = ["uint16", "int32"])]
    token_dtype: String,
    /// Run on a Ray cluster (`auto`, `ray://HOST:10001`, or `local` for a new local one):
    /// Ray's tasks read and write the shards, through Stoker's Python package (this runs
    /// `python3 -m stoker.ray pack`; STOKER_PYTHON names another interpreter). Tar, LMDB, or
    /// token ids (without --tokenize); not --group. Shards are named PREFIX-TASK-N.tar.
    #[arg(long, value_name = "ADDRESS")]
    ray: Option<String>,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
    /// No progress bar (it is only drawn when standard error is a terminal anyway).
    #[arg(long, short)]
    quiet: bool,
}

/// The progress bar, plus a test hook: `STOKER_TEST_PACK_ABORT_AFTER=N` kills the process
/// (no unwinding, no cleanup, like `kill -9`) once N samples are done, so tests can interrupt
/// a pack at a known point without timing.
struct Bar {
    pb: ProgressBar,
    done: AtomicU64,
    abort_after: Option<u64>,
}

impl PackProgress for Bar {
    fn planned(&self, samples: u64, bytes: u64) {
        self.pb.set_length(bytes);
        self.pb.set_message(format!("0/{samples} samples"));
    }

    fn advance(&self, samples: u64, bytes: u64) {
        let done = self.done.fetch_add(samples, Ordering::Relaxed) + samples;
        self.pb.inc(bytes);
        self.pb.set_message(format!("{done} samples"));
        if self.abort_after.is_some_and(|n| done >= n) {
            std::process::abort();
        }
    }

    fn stage(&self, what: &str) {
        self.pb.set_message(what.to_string());
    }
}

pub(crate) async fn run(args: PackArgs) -> Result<()> {
    // One read of --config: the source's options, and the destination's store options.
    let options = args.source.options()?;
    if let Some(address) = &args.ray {
        return on_ray(address, &args, &options);
    }
    if args.token_dtype != "uint16" {
        return Err(CliError::Message(
            "--token-dtype is for --ray; without it, --layout tokens picks the ids' type itself".into(),
        ));
    }
    let src = stoker::open(&args.source.uri, options.clone()).await?;
    let layout = match (args.layout, &args.tokenize) {
        (PackLayout::Tar, None) => Layout::Tar,
        (PackLayout::Lmdb, None) => Layout::Lmdb,
        (PackLayout::Tokens, tok) => return tokens(src, tok.as_deref(), &args).await,
        (_, Some(_)) => return Err(CliError::Message("--tokenize writes --layout tokens".into())),
    };
    let mut opts = PackOptions {
        layout,
        shard_size: args.shard_size,
        samples_per_shard: args.samples_per_shard,
        prefix: args.prefix.clone(),
        group: args.group,
        field: args.field.clone(),
        force: args.force,
        ..PackOptions::default()
    };
    if let Some(j) = args.jobs {
        opts.jobs = j.max(1);
    }
    if args.source.config.is_some() {
        // Remote destinations take the same store options (endpoint, region) as the source.
        opts.dest_options = options;
        (opts.dest_options.layout, opts.dest_options.list, opts.dest_options.field) = (None, None, None);
    }
    let bar = Bar {
        pb: crate::index::bar(
            args.quiet,
            "{spinner} packing [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} {msg} eta {eta}",
        ),
        done: AtomicU64::new(0),
        abort_after: std::env::var("STOKER_TEST_PACK_ABORT_AFTER").ok().and_then(|v| v.parse().ok()),
    };
    let r = stoker::pack::pack(src, &args.dest, &opts, &bar).await;
    bar.pb.finish_and_clear();
    let r = r?;
    let text = if args.json {
        serde_json::json!({
            "dest": r.dest, "layout": r.layout.as_str(), "samples": r.samples, "shards": r.shards,
            "payload_bytes": r.payload_bytes, "written_bytes": r.written_bytes, "resumed_shards": r.resumed_shards,
            "written_samples": r.written_samples, "seconds": r.seconds,
        })
        .to_string()
    } else {
        let resumed = if r.resumed_shards > 0 {
            format!(" ({} already complete from an earlier run)", r.resumed_shards)
        } else {
            String::new()
        };
        format!(
            "packed {} samples ({}) into {} {} {}{resumed}: {} on disk, in {}",
            r.samples,
            human_bytes(r.payload_bytes),
            r.shards,
            if r.layout == Layout::Tar { "tar shards at" } else { "LMDB at" },
            r.dest,
            human_bytes(r.written_bytes),
            human_duration(std::time::Duration::from_secs_f64(r.seconds))
        )
    };
    write_result(writeln!(io::stdout().lock(), "{text}"))
}

/// `--layout tokens`: tokenize the text into Megatron parts (see `stoker::tokens::pretokenize`),
/// or without a tokenizer copy arrays of ids into them (`stoker::tokens::pack_arrays`).
async fn tokens(
    src: std::sync::Arc<stoker::DynSampleSource>,
    tok: Option<&std::path::Path>,
    args: &PackArgs,
) -> Result<()> {
    use stoker::tokens::{pack_arrays, pretokenize, TextTokenizer, TokenizeOptions};
    // DEST is a URI as for the other layouts: its path, and its display (credentials
    // redacted) in what is printed. The parts are written to a local directory only.
    let parsed = stoker::uri::parse(&args.dest)?;
    let shown = parsed.display;
    let stoker::uri::Location::Local(dest) = parsed.location else {
        return Err(CliError::Message(format!(
            "{shown}: --layout tokens writes Megatron parts to a local directory; write them there, then copy the \
             directory to the store"
        )));
    };
    let started = std::time::Instant::now();
    let tokenizer = match tok {
        Some(t) => Some(std::sync::Arc::new(TextTokenizer::from_file(t)?)),
        None => None,
    };
    let append_eos = match (&args.append_eos, &tokenizer) {
        (None, _) => None,
        (Some(t), vocab) => Some(match (t.parse::<u32>(), vocab) {
            (Ok(id), _) if id > i32::MAX as u32 => {
                return Err(CliError::Message(format!("--append-eos {id}: token ids are below 2^31")))
            }
            (Ok(id), _) => id,
            (Err(_), Some(v)) => v.token_id(t).ok_or_else(|| {
                CliError::Message(format!("--append-eos {t:?}: neither an id nor a token of the tokenizer"))
            })?,
            (Err(_), None) => {
                return Err(CliError::Message(format!("--append-eos {t:?}: a token by its text needs --tokenize")))
            }
        }),
    };
    let opts = TokenizeOptions {
        field: args.field.clone(),
        append_eos,
        documents_per_part: args.documents_per_part.max(1),
        skip_errors: args.skip_errors,
        force: args.force,
        ..TokenizeOptions::default()
    };
    let pb = crate::index::bar(args.quiet, "{spinner} tokenizing [{bar:40}] {pos}/{len} documents {per_sec} eta {eta}");
    pb.set_length(src.len() as u64);
    let m = match tokenizer {
        Some(t) => pretokenize(src, t, &dest, &opts, &|n| pb.inc(n)).await,
        None => pack_arrays(src, &dest, &opts, &|n| pb.inc(n)).await,
    };
    pb.finish_and_clear();
    let m = m?;
    let tokens: u64 = m.parts.iter().map(|p| p.tokens).sum();
    // The first reasons each part kept, and how many documents were bad in all.
    let skipped: Vec<&(u64, String)> = m.parts.iter().flat_map(|p| &p.skipped).collect();
    let bad: u64 = m.parts.iter().map(|p| p.skipped_documents()).sum();
    let secs = started.elapsed().as_secs_f64();
    let text = if args.json {
        let skipped: Vec<_> = skipped.iter().map(|(d, why)| serde_json::json!({"document": d, "error": why})).collect();
        serde_json::json!({
            "dest": shown, "layout": "tokens", "documents": m.documents, "tokens": tokens,
            "parts": m.parts.len(), "seconds": secs, "skipped": skipped, "skipped_documents": bad,
        })
        .to_string()
    } else {
        let mut t = format!(
            "tokenized {} documents into {tokens} tokens: {} Megatron part(s) at {}, in {}",
            m.documents,
            m.parts.len(),
            shown,
            human_duration(std::time::Duration::from_secs_f64(secs))
        );
        if bad > 0 {
            t += &format!("\n{bad} bad document(s) written empty (--skip-errors):");
            for (d, why) in skipped.iter().take(10) {
                t += &format!("\n  document {d}: {why}");
            }
        }
        t
    };
    write_result(writeln!(io::stdout().lock(), "{text}"))
}

/// `--ray`: the pack as Ray tasks, run by the Python package (`stoker.ray.pack`). Options from
/// --config go through the environment, not the command line, which every user can see.
fn on_ray(address: &str, args: &PackArgs, options: &stoker::SourceOptions) -> Result<()> {
    if args.token_dtype != "uint16" && !matches!(args.layout, PackLayout::Tokens) {
        return Err(CliError::Message("--token-dtype is for --layout tokens".into()));
    }
    if args.group || args.tokenize.is_some() || args.append_eos.is_some() {
        return Err(CliError::Message(
            "--ray packs each source sample as one sample (no --group) and writes token ids as they are (no \
             --tokenize or --append-eos): run those without --ray"
                .into(),
        ));
    }
    let python = std::env::var("STOKER_PYTHON").unwrap_or_else(|_| "python3".into());
    let layout = match args.layout {
        PackLayout::Tar => "tar",
        PackLayout::Lmdb => "lmdb",
        PackLayout::Tokens => "tokens",
    };
    let mut cmd = std::process::Command::new(&python);
    cmd.args(["-m", "stoker.ray", "pack", &args.source.uri, &args.dest, "--layout", layout]);
    cmd.args(["--shard-size", &args.shard_size.to_string(), "--prefix", &args.prefix]);
    // `local` too: Ray then starts a new local cluster even where RAY_ADDRESS names another.
    cmd.args(["--address", address]);
    cmd.args(["--token-dtype", &args.token_dtype]);
    if let Some(n) = args.samples_per_shard {
        cmd.args(["--samples-per-shard", &n.to_string()]);
    }
    if let Some(f) = &args.field {
        cmd.args(["--field", f]);
    }
    if args.force {
        cmd.arg("--force");
    }
    if args.json {
        cmd.arg("--json");
    }
    if args.source.config.is_some() {
        let json = serde_json::to_string(options).map_err(|e| CliError::Message(format!("--config: {e}")))?;
        cmd.env("STOKER_RAY_OPTIONS", json);
    }
    let status = cmd.status().map_err(|e| {
        CliError::Message(format!(
            "--ray runs `{python} -m stoker.ray`, which could not start ({e}): install Stoker's Python package with \
             Ray (pip install 'stoker[ray]'), or set STOKER_PYTHON to the interpreter that has it"
        ))
    })?;
    if !status.success() {
        return Err(CliError::Message(format!(
            "the pack on Ray failed ({status}; its error is above). `{python} -m stoker.ray` needs Stoker's Python \
             package with Ray (pip install 'stoker[ray]'; STOKER_PYTHON names another interpreter). Rerun the same \
             command to resume: shards already written are kept"
        )));
    }
    Ok(())
}
