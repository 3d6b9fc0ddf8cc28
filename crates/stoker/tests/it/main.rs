//! The library's integration tests, one module per area, linked into one test binary: each
//! separate binary cost a link of the whole dependency tree (most of the suite's build time)
//! and tens of MB of disk.
//!
//! Three stay binaries of their own (tests/*.rs), because they need a process to themselves:
//! `loader_alloc.rs` and `decode_images.rs` install a counting `#[global_allocator]`, and
//! `lmdb_fork.rs` forks, which is only safe while no other test thread holds a lock.
//!
//! Tests that start a child process of this binary select their child test by its full name,
//! module path included (see `disk_cache`).

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod cache_blocks;
mod cache_damage;
mod cache_eviction;
mod color;
mod conformance_local;
mod corrupt;
mod damage;
mod decode;
mod demo;
mod diagnose;
mod disk_cache;
mod error_kind;
mod faults;
mod fuzz_corpus;
mod gpu;
mod hdf5;
mod hostile;
mod hostile_answers;
mod hostile_servers;
mod http_store;
mod keys;
mod loader;
mod mix;
mod mix_props;
mod node_ranks;
mod parquet;
mod pinned;
mod pool_props;
mod records;
mod remote_azure;
mod remote_gcs;
mod remote_s3;
mod sampler_props;
mod secrets;
mod shard_stream;
mod shard_writer;
mod snapshot;
mod tar_index;
mod text;
mod tfrecord;
mod tls;
mod tokens;
