//! `stoker pack`: convert any source into WebDataset tar shards or an LMDB.

use clap::Args;

use crate::SourceArgs;

/// Arguments of `stoker pack`.
#[derive(Args)]
pub(crate) struct PackArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Where to write the packed dataset.
    dest: String,
}

pub(crate) async fn run(args: PackArgs) -> Result<(), String> {
    let _ = (&args.source.uri, &args.dest);
    Err("stoker pack is not built yet".into())
}
