//! The test kit's integration tests, linked into one test binary (a binary per file cost a
//! link each). The servers under test run in-process on loopback ports of their own or as
//! child processes, so none needs a process of its own.

mod common;

mod cli;
mod fault_proxy;
mod s3_server;
