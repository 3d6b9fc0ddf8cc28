//! `stoker index URI`: build or refresh tar sidecar indexes and write the manifest.

use std::io::{self, Write};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{human_bytes, human_duration, write_result, SourceArgs};

/// A bar on standard error, drawn only on a terminal and when not `quiet`.
pub(crate) fn bar(quiet: bool, template: &str) -> ProgressBar {
    use std::io::IsTerminal;
    let target =
        if quiet || !io::stderr().is_terminal() { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
    let pb = ProgressBar::with_draw_target(None, target);
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

pub(crate) async fn run(args: &SourceArgs, json: bool, quiet: bool) -> Result<(), String> {
    let options = args.options()?;
    let started = Instant::now();
    let pb = bar(quiet, "{spinner} indexing [{bar:40}] {pos}/{len} shards {elapsed}");
    let on_shard = {
        let pb = pb.clone();
        move |done: usize, total: usize| {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        }
    };
    let r = stoker::index_with_progress(&args.uri, options, &on_shard).await;
    pb.finish_and_clear();
    let r = r.map_err(|e| e.to_string())?;
    let took = started.elapsed();
    let text = if json {
        serde_json::json!({
            "manifest": r.manifest, "manifest_bytes": r.manifest_bytes, "layout": r.layout.as_str(),
            "objects": r.objects, "samples": r.samples, "seconds": took.as_secs_f64(),
        })
        .to_string()
    } else {
        format!(
            "wrote {} ({}): {} layout, {} objects, {} samples, in {}",
            r.manifest,
            human_bytes(r.manifest_bytes),
            r.layout,
            r.objects,
            r.samples,
            human_duration(took)
        )
    };
    write_result(writeln!(io::stdout().lock(), "{text}"))
}
