//! `stoker index URI`: build or refresh tar sidecar indexes and write the manifest.

use std::io::{self, Write};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::error::Result;
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

/// What `index` adds to the source options.
pub(crate) struct Extra {
    /// `--checksums`: record an XXH3-64 digest per member.
    pub checksums: bool,
    /// `--skip-damage`: step over damage, listing it.
    pub skip_damage: bool,
}

/// Damage stepped over, one line each after a heading; empty when there is none.
pub(crate) fn damage_lines(damage: &[stoker::Damage]) -> String {
    if damage.is_empty() {
        return String::new();
    }
    let mut text = format!("\ndamage      {} region(s) skipped:", damage.len());
    for d in damage {
        text.push_str(&format!("\n  {d}"));
    }
    text
}

/// Damage as JSON, its keys and shard names escaped as `ls` prints keys: JSON escapes only
/// some control characters, and a reader may print these fields as they are.
pub(crate) fn damage_json(damage: &[stoker::Damage]) -> serde_json::Value {
    use serde_json::Value;
    use stoker::sample::{display_key, escape_controls};
    let escape_key = |v: &mut Value| {
        if let Value::String(s) = v {
            *s = display_key(s).into_owned();
        }
    };
    let mut all = serde_json::to_value(damage).unwrap_or_default();
    for d in all.as_array_mut().into_iter().flatten() {
        for k in ["key_before", "key_after"] {
            if let Some(v) = d.get_mut(k) {
                escape_key(v);
            }
        }
        d.get_mut("dropped").and_then(Value::as_array_mut).into_iter().flatten().for_each(escape_key);
        for k in ["shard", "reason"] {
            if let Some(Value::String(s)) = d.get_mut(k) {
                *s = escape_controls(s).into_owned();
            }
        }
    }
    all
}

pub(crate) async fn run(args: &SourceArgs, json: bool, quiet: bool, extra: Extra) -> Result<()> {
    let mut options = args.options()?;
    if extra.checksums {
        options.checksums = Some(true);
    }
    if extra.skip_damage {
        options.on_damage = Some(stoker::DamagePolicy::Skip);
    }
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
    let r = r?;
    let took = started.elapsed();
    let text = if json {
        serde_json::json!({
            "manifest": r.manifest, "manifest_bytes": r.manifest_bytes, "layout": r.layout.as_str(),
            "objects": r.objects, "samples": r.samples, "seconds": took.as_secs_f64(),
            "checksums": r.checksums, "damage": damage_json(&r.damage),
        })
        .to_string()
    } else {
        format!(
            "wrote {} ({}): {} layout, {} objects, {} samples, in {}{}{}",
            r.manifest,
            human_bytes(r.manifest_bytes),
            r.layout,
            r.objects,
            r.samples,
            human_duration(took),
            if r.checksums { ", with payload checksums" } else { "" },
            damage_lines(&r.damage)
        )
    };
    write_result(writeln!(io::stdout().lock(), "{text}"))
}
