//! `stoker diagnose`: measure each step of the caching ladder and name where the pipeline starves.

use clap::Args;

use crate::SourceArgs;

/// Arguments of `stoker diagnose`.
#[derive(Args)]
pub(crate) struct DiagnoseArgs {
    #[command(flatten)]
    source: SourceArgs,
}

pub(crate) async fn run(args: DiagnoseArgs) -> Result<(), String> {
    let _ = &args.source.uri;
    Err("stoker diagnose is not built yet".into())
}
