//! The `stoker` binary's integration tests, one module per command, linked into one test
//! binary (a binary per file cost a link each). They run the real binary as child processes,
//! so none needs a process of its own.

mod common;

mod bench;
mod cli;
mod diagnose;
mod hostile;
mod keys;
mod pack;
mod pack_hostile;
mod secrets;
mod tokens;
