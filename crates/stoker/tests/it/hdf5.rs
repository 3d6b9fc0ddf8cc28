//! HDF5 files written by h5py (its default format and `libver="latest"`, every dataset kind the
//! field convention names, chunked with gzip, shuffle and LZF) through the conformance suite
//! locally and over S3; damaged chunks, truncated files and lying headers are clear errors
//! naming the file, in bounded memory.

use crate::common;

use std::path::Path;

use common::s3::{uri, SK};
use common::*;
use stoker::conformance::run_all;
use stoker::{Layout, Sample};

fn fixture(kind: &str, dir: &Path) -> Vec<Sample> {
    script_fixture(&writers_python(), "write_hdf5.py", &[kind], dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hdf5_files_of_h5py_pass_conformance_locally_and_over_s3() {
    let root = tempfile::tempdir().unwrap();
    let (mixed, latest) = (root.path().join("data").join("mixed"), root.path().join("data").join("latest"));
    let want = fixture("mixed", &mixed);
    let src = open(mixed.to_str().unwrap()).await;
    assert_eq!((src.info().known_layout(), src.info().shards), (Some(Layout::Hdf5), 2));
    run_all(src, &want, "mixed", &[]).await;
    let want_latest = fixture("latest", &latest);
    run_all(open(latest.to_str().unwrap()).await, &want_latest, "latest", &[]).await;
    let server = common::s3::serve(root.path()).await;
    run_all(open(&uri(&server.endpoint(), "mixed", "")).await, &want, "s3://data/mixed", &[SK]).await;
    run_all(open(&uri(&server.endpoint(), "latest", "")).await, &want_latest, "s3://data/latest", &[SK]).await;
}
