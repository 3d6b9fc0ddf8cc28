//! What `bench` shows while it works: progress bars on a terminal, one plain line per step
//! otherwise (so a log or CI run still says what is happening, without escape codes).

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress bars on stderr; stdout stays for the results.
pub(crate) struct Ui {
    multi: MultiProgress,
    terminal: bool,
}

/// What a bar counts.
pub(crate) enum Unit {
    Bytes,
    Samples,
}

impl Ui {
    pub(crate) fn new() -> Self {
        let terminal = std::io::stderr().is_terminal();
        let target = if terminal { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        Ui { multi: MultiProgress::with_draw_target(target), terminal }
    }

    /// A bar for one step; off a terminal the step is announced as a line instead.
    pub(crate) fn bar(&self, step: &str, len: u64, unit: Unit) -> ProgressBar {
        if !self.terminal {
            eprintln!("stoker bench: {step}");
            return ProgressBar::hidden();
        }
        let template = match unit {
            Unit::Bytes => "{prefix:>14} [{bar:32}] {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} {msg}",
            // The rate is the caller's message: indicatif's {per_sec} prints long fractions.
            Unit::Samples => "{prefix:>14} [{bar:32}] {human_pos:>9}/{human_len:<9} {elapsed:>4} {msg}",
        };
        let style =
            ProgressStyle::with_template(template).expect("the templates above are valid").progress_chars("=> ");
        let bar = self.multi.add(ProgressBar::new(len).with_style(style).with_prefix(step.to_string()));
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        bar
    }

    /// A line above the bars (or on stderr off a terminal).
    pub(crate) fn note(&self, line: &str) {
        if self.terminal {
            let _ = self.multi.println(line);
        } else {
            eprintln!("stoker bench: {line}");
        }
    }
}
