//! The user docs' Rust blocks, compiled as doctests (`cargo test --doc`) so they cannot rot.
//! Every Markdown page is listed here; `crates/stoker-py/tests/test_docs.py` checks that none
//! is missing and runs the pages' Python and CLI blocks.

/// README.md
#[doc = include_str!("../../../README.md")]
pub struct Readme;
/// docs/benchmarks.md
#[doc = include_str!("../../../docs/benchmarks.md")]
pub struct DocsBenchmarks;
/// docs/cli.md
#[doc = include_str!("../../../docs/cli.md")]
pub struct DocsCli;
/// docs/development.md
#[doc = include_str!("../../../docs/development.md")]
pub struct DocsDevelopment;
/// docs/images.md
#[doc = include_str!("../../../docs/images.md")]
pub struct DocsImages;
/// docs/loader.md
#[doc = include_str!("../../../docs/loader.md")]
pub struct DocsLoader;
/// docs/mixing.md
#[doc = include_str!("../../../docs/mixing.md")]
pub struct DocsMixing;
/// docs/ray.md
#[doc = include_str!("../../../docs/ray.md")]
pub struct DocsRay;
/// docs/reliability.md
#[doc = include_str!("../../../docs/reliability.md")]
pub struct DocsReliability;
/// docs/remote.md
#[doc = include_str!("../../../docs/remote.md")]
pub struct DocsRemote;
/// docs/sources.md
#[doc = include_str!("../../../docs/sources.md")]
pub struct DocsSources;
/// docs/tokens.md
#[doc = include_str!("../../../docs/tokens.md")]
pub struct DocsTokens;
