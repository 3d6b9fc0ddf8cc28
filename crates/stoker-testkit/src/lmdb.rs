//! LMDB environments written with heed, as the tests of every crate make them.

use std::path::Path;

use heed::types::Bytes as B;

/// Write `records` (key, value) to a new LMDB environment in `dir` (made if missing); keys in
/// byte order are the sample order a reader gives. Panics on failure: a fixture for tests.
pub fn write_lmdb(dir: &Path, records: &[(&[u8], &[u8])]) {
    std::fs::create_dir_all(dir).unwrap();
    // SAFETY: a fresh environment in a directory of the caller's own, opened once.
    let env = unsafe { heed::EnvOpenOptions::new().map_size(256 << 20).open(dir).unwrap() };
    let w = env.write_txn().unwrap();
    let db: heed::Database<B, B> = env
        .create_databases_and_commit(w, |wdo, wtxn| {
            wdo.create_database::<B, B>(wtxn, None).map(heed::CommitOrAbort::<_, ()>::Commit)
        })
        .unwrap()
        .unwrap_commit();
    let mut w = env.write_txn().unwrap();
    for (k, v) in records {
        db.put(&mut w, k, v).unwrap();
    }
    w.commit().unwrap();
    env.prepare_for_closing().wait();
}
