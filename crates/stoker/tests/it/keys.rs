//! LMDB keys that are not UTF-8 stay distinct everywhere the library hands a key out: `get`,
//! `meta` and the Loader's batches give the same lossless text, which turns back into the
//! key's bytes. (The CLI's printing and `pack` are tested in crates/stoker-cli/tests/it/keys.rs.)

use crate::common;

use futures::StreamExt;
use stoker::sample::{escape_key, unescape_key};
use stoker::{Loader, LoaderConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_are_not_utf8_stay_distinct_in_samples_metas_and_batches() {
    let dir = tempfile::tempdir().unwrap();
    let keys: [&[u8]; 5] = [b"a\xfe", b"a\xff", b"a\xef\xbf\xbd", b"a\\xff", b"esc\x1b"];
    let records: Vec<(Vec<u8>, Vec<u8>)> = keys.iter().map(|k| (k.to_vec(), k.to_vec())).collect();
    common::write_lmdb(dir.path(), &records);
    let src = stoker::open(dir.path().to_str().unwrap(), Default::default()).await.unwrap();
    let mut sorted: Vec<&[u8]> = keys.to_vec();
    sorted.sort();
    let mut from_get = Vec::new();
    for (i, raw) in sorted.iter().enumerate() {
        let s = src.get(i).await.unwrap();
        assert_eq!(s.key, escape_key(raw), "sample {i}");
        assert_eq!(&*unescape_key(&s.key), *raw, "sample {i} turns back into its bytes");
        assert_eq!(s.fields[0].data, *raw, "sample {i} is the record of that key");
        assert_eq!(src.meta(i).await.unwrap().key, s.key, "meta {i}");
        from_get.push(s.key);
    }
    // U+FFFD written as UTF-8 is a key of its own, not what an invalid byte becomes.
    let distinct: std::collections::BTreeSet<_> = from_get.iter().collect();
    assert_eq!(distinct.len(), keys.len(), "{from_get:?}");

    let loader = Loader::new(src.clone(), LoaderConfig::new(8)).unwrap();
    let mut stream = loader.epoch(0).unwrap();
    let batch = stream.next().await.unwrap().unwrap();
    let from_batch: Vec<String> = batch.keys().map(str::to_string).collect();
    assert_eq!(from_batch, from_get, "batches carry the same keys as samples");
}
