//! `stoker`: look inside datasets that feed GPU training, from any source URI.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

// Without the demo, the parts only the demo uses (its backends, byte-unit progress bars) rest.
#[cfg_attr(not(feature = "demo"), allow(dead_code))]
mod bench;
mod diagnose;
mod error;
mod index;
mod pack;
mod shuffle;
mod tokens;
mod units;
use error::{CliError, Context, Result};
use stoker::sample::{display_key, escape_controls};
use stoker::{DynSampleSource, SourceOptions};

/// mimalloc, not glibc's malloc, as in the Python extension: formats stored in big pages
/// (Parquet) allocate and free buffers of tens of MiB per shard, which glibc maps afresh each
/// time (every page faults and is zeroed again); mimalloc keeps them for reuse. Built with
/// `no_thp`: mimalloc would otherwise advise huge pages on its arenas, which some VMs serve
/// erratically (a sequential Parquet pass went bimodal, 7.5k-48k samples/s); without the advice
/// the kernel's own THP setting decides, as for any other allocator, and nothing process-wide
/// is changed. It replaced jemalloc, whose configure and make were a minute of a first build;
/// in same-run A/B runs the Parquet pass, JPEG decoding and the token loader matched it.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const URI_HELP: &str = "Where the samples are: a directory of files, a directory of .tar shards, \
a brace pattern like 'shards/train-{000..127}.tar', an LMDB directory (with data.mdb), or the \
same as a file:// URI. Options go in the query: '?layout=tar&concurrency=64'. A mix of sources by \
weight is a mix file: 'train.mix.toml', 'train.mix.json', 'mix:PATH' or 'mix:{JSON}' (see the README's \
\"Mixing sources\"); --config options then apply to every source under its own.";

/// Stoker keeps the GPU fed. This tool lists, reads and describes the samples a source holds.
#[derive(Parser)]
#[command(
    name = "stoker",
    version,
    after_help = "Examples:\n  \
stoker inspect ./shards\n  stoker index s3://bucket/shards\n  stoker ls 'shards/train-{000..003}.tar' --limit 5\n  stoker cat ./lmdb-dir 0 > first.bin"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List samples: index, key, and each field with its size. Keys and field names are
    /// printed escaped: a backslash as `\\`, control characters and bytes that are not UTF-8
    /// as `\xNN` (also with --json).
    Ls {
        #[command(flatten)]
        source: SourceArgs,
        /// Print one JSON object per line instead of text.
        #[arg(long)]
        json: bool,
        /// Stop after this many samples.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Write one field of one sample, raw, to standard output.
    Cat {
        #[command(flatten)]
        source: SourceArgs,
        /// The sample's index (0-based, in the source's order; see `stoker ls`).
        index: usize,
        /// Which field to write; required when the sample has more than one.
        #[arg(long)]
        field: Option<String>,
    },
    /// Build or refresh tar indexes and write the dataset's manifest, so later opens read one
    /// small object instead of listing the directory or bucket prefix.
    Index {
        #[command(flatten)]
        source: SourceArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// No progress bar (it is only drawn when standard error is a terminal anyway).
        #[arg(long, short)]
        quiet: bool,
        /// Record an XXH3-64 digest of every tar member's payload (reads every payload once), so
        /// reads detect payload damage from then on.
        #[arg(long)]
        checksums: bool,
        /// Step over damaged tar headers (resynchronising at the next valid one) and
        /// unreadable shards instead of failing; the damage is listed.
        #[arg(long)]
        skip_damage: bool,
    },
    /// Benchmark backends through the Loader against a raw read of the same bytes.
    Bench(bench::BenchArgs),
    /// Convert any source into WebDataset tar shards or an LMDB.
    Pack(pack::PackArgs),
    /// Find where a pipeline starves: measure each step of the caching ladder.
    Diagnose(diagnose::DiagnoseArgs),
    /// Packed language-model batches from any source (tokenized in Rust, mixed by tokens,
    /// any rank of any world size, resumable): tokens/s, the ids, the state.
    Tokens(tokens::TokensArgs),
    /// Write a small demo dataset to try Stoker on (the docs' examples use it): JPEG images
    /// with labels in tar shards (DIR/images), a JSONL corpus (DIR/text) and its tokenizer
    /// (DIR/tokenizer.json).
    Demo {
        /// The directory to write (created if missing).
        #[arg(default_value = "demo")]
        dir: PathBuf,
        /// Images, over four tar shards.
        #[arg(long, default_value_t = 512)]
        images: usize,
        /// Documents, over two JSONL files.
        #[arg(long, default_value_t = 1000)]
        documents: usize,
    },
    /// Describe a source: layout, samples, shards, fields, total bytes, time to open.
    Inspect {
        #[command(flatten)]
        source: SourceArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub(crate) struct SourceArgs {
    #[arg(help = URI_HELP)]
    pub(crate) uri: String,
    /// Options from a JSON or TOML file (the same keys as the URI query; the query wins).
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
}

impl SourceArgs {
    /// The options of `--config`, or the defaults.
    pub(crate) fn options(&self) -> Result<SourceOptions> {
        options(self.config.as_deref())
    }

    pub(crate) async fn open(&self) -> Result<Arc<DynSampleSource>> {
        Ok(stoker::open(&self.uri, self.options()?).await?)
    }
}

/// The options in the config file at `path`, or the defaults without one.
pub(crate) fn options(path: Option<&Path>) -> Result<SourceOptions> {
    path.map_or_else(|| Ok(SourceOptions::default()), load_config)
}

fn load_config(path: &Path) -> Result<SourceOptions> {
    let bytes = stoker::store::read_capped(path, stoker::store::SMALL_FILE_BYTES)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        .with_context(|| format!("config {} is not UTF-8 text", path.display()))?;
    let is_json = path.extension().is_some_and(|e| e == "json") || text.trim_start().starts_with('{');
    // Both parsers keep credentials (and, for TOML, the lines holding them) out of errors.
    let parsed = if is_json { SourceOptions::from_json(&text) } else { SourceOptions::from_toml(&text) };
    parsed.with_context(|| format!("config {}", path.display()))
}

fn main() -> ExitCode {
    // Clap prints usage errors, --help and --version itself and exits (2 for a bad command line).
    let cli = Cli::parse();
    match try_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Messages quote keys, names and paths from data: nothing in them reaches the
            // terminal as a control character.
            let e_text = escape_controls(&e.to_string()).into_owned();
            match e.advice() {
                Some(advice) => eprintln!("error: {e_text} ({advice})"),
                None => eprintln!("error: {e_text}"),
            }
            e.exit_code()
        }
    }
}

#[tokio::main]
async fn try_main(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Ls { source, json, limit } => ls(&source, json, limit).await,
        Command::Cat { source, index, field } => cat(&source, index, field.as_deref()).await,
        Command::Inspect { source, json } => inspect(&source, json).await,
        Command::Demo { dir, images, documents } => {
            let r = stoker::demo::write(&dir, &stoker::demo::DemoOptions { images, documents })?;
            println!(
                "wrote {images} images ({}), {documents} documents ({}) and {} ({:.1} MB)",
                r.images.display(),
                r.text.display(),
                r.tokenizer.display(),
                r.bytes as f64 / 1e6
            );
            Ok(())
        }
        Command::Index { source, json, quiet, checksums, skip_damage } => {
            index::run(&source, json, quiet, index::Extra { checksums, skip_damage }).await
        }
        Command::Bench(args) => bench::run(args).await,
        Command::Pack(args) => pack::run(args).await,
        Command::Diagnose(args) => diagnose::run(args).await,
        Command::Tokens(args) => tokens::run(args).await,
    }
}

/// A closed pipe (`stoker ls | head`) is a normal way to stop, not an error.
pub(crate) fn write_result(r: io::Result<()>) -> Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing output"),
    }
}

async fn ls(args: &SourceArgs, json: bool, limit: Option<usize>) -> Result<()> {
    let src = args.open().await?;
    let n = limit.map_or(src.len(), |l| l.min(src.len()));
    let mut out = BufWriter::new(io::stdout().lock());
    for i in 0..n {
        let meta = src.meta(i).await?;
        let line = if json {
            let fields: serde_json::Map<String, serde_json::Value> =
                meta.fields.iter().map(|(name, size)| (display_key(name).into_owned(), (*size).into())).collect();
            serde_json::json!({"index": i, "key": display_key(&meta.key), "fields": fields}).to_string()
        } else {
            let fields: Vec<String> =
                meta.fields.iter().map(|(name, size)| format!("{}={size}", display_key(name))).collect();
            format!("{i}\t{}\t{}", display_key(&meta.key), fields.join(" "))
        };
        if let Err(e) = writeln!(out, "{line}") {
            return write_result(Err(e));
        }
    }
    write_result(out.flush())
}

async fn cat(args: &SourceArgs, index: usize, field: Option<&str>) -> Result<()> {
    let src = args.open().await?;
    let sample = src.get(index).await?;
    let data = match field {
        Some(name) => sample.require(name)?,
        None if sample.fields.len() == 1 => &sample.fields[0].data,
        None => {
            let names: Vec<_> = sample.field_names().map(display_key).collect();
            return Err(CliError::Message(format!(
                "sample {index} ({}) has {} fields ({}); choose one with --field NAME",
                display_key(&sample.key),
                names.len(),
                names.join(", ")
            )));
        }
    };
    let mut out = io::stdout().lock();
    write_result(out.write_all(data).and_then(|_| out.flush()))
}

/// Per-field totals for `inspect`.
#[derive(Default)]
struct FieldTotal {
    samples: u64,
    bytes: u64,
}

async fn inspect(args: &SourceArgs, json: bool) -> Result<()> {
    let started = Instant::now();
    let src = args.open().await?;
    let open_time = started.elapsed();
    let mut fields: Vec<(String, FieldTotal)> = Vec::new();
    // Each name's place in `fields` (kept in order of first sight): a search of the list for
    // every field took 24 s over one shard of 40,000 distinct names.
    let mut slots: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut total = 0u64;
    for i in 0..src.len() {
        let meta = src.meta(i).await?;
        for (name, size) in &meta.fields {
            let shown = display_key(name);
            let slot = match slots.get(&*shown) {
                Some(&p) => p,
                None => {
                    slots.insert(shown.clone().into_owned(), fields.len());
                    fields.push((shown.into_owned(), FieldTotal::default()));
                    fields.len() - 1
                }
            };
            fields[slot].1.samples += 1;
            fields[slot].1.bytes += size;
            total += size;
        }
    }
    let info = src.info();
    let cap = src.capability();
    let caps: Vec<&str> = [
        ("random_access", cap.random_access),
        ("coalesced_reads", cap.coalesced_reads),
        ("locality", cap.locality),
        ("cheap_meta", cap.cheap_meta),
        ("local", cap.local),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(n, _)| *n)
    .collect();
    // A mix: what one epoch takes from each source.
    let mix = src.as_mix().map(|m| {
        let plan = m.plan();
        let per: Vec<(_, u64, u64)> = m
            .names()
            .zip(plan.sizes().iter().copied())
            .zip(plan.counts())
            .map(|((n, size), c)| (display_key(n), size, c))
            .collect();
        (plan.len(), plan.replacement(), per)
    });
    let mut out = io::stdout().lock();
    let text = if json {
        let mix = mix.as_ref().map(|(len, replacement, per)| {
            let sources: Vec<_> = per
                .iter()
                .map(|(n, size, c)| serde_json::json!({"name": n, "samples": size, "per_epoch": c}))
                .collect();
            serde_json::json!({"epoch_length": len, "replacement": replacement, "sources": sources})
        });
        let f: Vec<_> = fields
            .iter()
            .map(|(n, t)| serde_json::json!({"name": n, "samples": t.samples, "bytes": t.bytes}))
            .collect();
        serde_json::json!({
            "source": escape_controls(&src.to_string()), "layout": &*info.layout, "samples": src.len(),
            "shards": info.shards, "fields": f, "total_bytes": total,
            "open_seconds": open_time.as_secs_f64(), "capability": caps, "damage": index::damage_json(&src.damage()), "mix": mix,
        })
        .to_string()
    } else {
        let f: Vec<String> =
            fields.iter().map(|(n, t)| format!("{n} ({} samples, {})", t.samples, human_bytes(t.bytes))).collect();
        format!(
            "source      {}\nlayout      {}\nsamples     {}\nshards      {}\nfields      {}\ntotal bytes {} ({total} bytes)\nopen time   {}\ncapability  {}",
            escape_controls(&src.to_string()),
            info.layout,
            src.len(),
            info.shards,
            f.join(", "),
            human_bytes(total),
            human_duration(open_time),
            caps.join(", ")
        ) + &mix.map_or(String::new(), |(len, replacement, per)| {
            let per: Vec<String> = per.iter().map(|(n, size, c)| format!("{n} {c} of {size}")).collect();
            let repl = if replacement { ", with replacement" } else { "" };
            format!("\nepoch       {len} samples{repl}: {}", per.join(", "))
        }) + &index::damage_lines(&src.damage())
    };
    write_result(writeln!(out, "{text}"))
}

pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub(crate) fn human_duration(d: Duration) -> String {
    if d.as_secs_f64() >= 1.0 {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    }
}
