//! `--shuffle` and `--shuffle-window`, shared by `bench` and `diagnose`.

use clap::{Args, ValueEnum};
use stoker::sampler::{Order, DEFAULT_SHARD_WINDOW};

use crate::error::Result;

/// How each epoch orders the samples.
#[derive(Args, Clone, Debug, Default)]
pub(crate) struct ShuffleArgs {
    /// Order of each epoch: `samples` (a new permutation of all samples; what `--shuffle`
    /// alone means), `shards` (permute the shards and shuffle the samples of each window
    /// of --shuffle-window shards together; each window's shards are read ahead with a few
    /// large requests), or `none` (storage order, the default).
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "samples", value_name = "ORDER")]
    shuffle: Option<Shuffle>,
    /// With `--shuffle shards`: shards whose samples are shuffled together [default: 4].
    #[arg(long, value_name = "SHARDS")]
    shuffle_window: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Shuffle {
    Samples,
    Shards,
    None,
}

impl ShuffleArgs {
    /// The order these flags ask for, every shuffle seeded with `seed`.
    pub(crate) fn order(&self, seed: u64) -> Result<Order> {
        match (self.shuffle, self.shuffle_window) {
            (Some(Shuffle::Shards), Some(0)) => Err("--shuffle-window must be at least 1 shard".into()),
            (Some(Shuffle::Shards), w) => Ok(Order::ShardShuffle { seed, window: w.unwrap_or(DEFAULT_SHARD_WINDOW) }),
            (_, Some(_)) => Err("--shuffle-window applies to `--shuffle shards` only".into()),
            (Some(Shuffle::Samples), None) => Ok(Order::Shuffle { seed }),
            (Some(Shuffle::None) | None, None) => Ok(Order::Sequential),
        }
    }

    /// The flags again, for a child process.
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(s) = self.shuffle {
            a.push("--shuffle".into());
            a.push(s.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default());
        }
        if let Some(w) = self.shuffle_window {
            a.push("--shuffle-window".into());
            a.push(w.to_string());
        }
        a
    }

    /// How a report names the order.
    pub(crate) fn describe(&self) -> String {
        match self.order(0) {
            Ok(Order::Shuffle { .. }) => "shuffled".into(),
            Ok(Order::ShardShuffle { window, .. }) => format!("shard-shuffled (window {window})"),
            _ => "sequential".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        s: ShuffleArgs,
        rest: Vec<String>,
    }

    fn order(args: &[&str]) -> Result<Order, String> {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map_err(|e| e.to_string())?;
        let order = cli.s.order(9).map_err(|e| e.to_string())?;
        // What a child process is given parses back to the same order.
        let again = Cli::try_parse_from(std::iter::once("x".to_string()).chain(cli.s.to_args())).unwrap();
        assert_eq!(again.s.order(9).ok(), Some(order.clone()));
        Ok(order)
    }

    #[test]
    fn flags_to_orders() {
        assert_eq!(order(&[]), Ok(Order::Sequential));
        assert_eq!(order(&["--shuffle"]), Ok(Order::Shuffle { seed: 9 }));
        assert_eq!(order(&["--shuffle", "samples"]), Ok(Order::Shuffle { seed: 9 }));
        assert_eq!(order(&["--shuffle", "none"]), Ok(Order::Sequential));
        assert_eq!(order(&["--shuffle", "shards"]), Ok(Order::ShardShuffle { seed: 9, window: DEFAULT_SHARD_WINDOW }));
        assert_eq!(
            order(&["--shuffle", "shards", "--shuffle-window", "7"]),
            Ok(Order::ShardShuffle { seed: 9, window: 7 })
        );
        assert_eq!(order(&["a", "--shuffle"]), Ok(Order::Shuffle { seed: 9 }));
        assert!(order(&["--shuffle", "shards", "--shuffle-window", "0"]).unwrap_err().contains("at least 1"));
        assert!(order(&["--shuffle", "--shuffle-window", "2"]).unwrap_err().contains("`--shuffle shards` only"));
        let bad = order(&["--shuffle", "random"]).unwrap_err();
        assert!(bad.contains("samples") && bad.contains("shards"), "{bad}");
    }
}
