//! `Error::kind()` is what callers match on: the same for an error that reached them through
//! a single-flight cache (`Error::Shared`) as for one that did not.

use crate::common;
use crate::common::s3::uri;
use crate::common::*;
use stoker::{Error, ErrorKind};

/// A tar shard indexed at open and deleted before it is read, read twice at once through
/// one source with a block cache: the reads share the fetch, and both say `NotFound`, as a
/// read without the cache does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_shard_read_through_the_cache_is_not_found() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("tar");
    std::fs::create_dir_all(&dir).unwrap();
    let samples = tar_dir(&dir, 3, 4);
    let server = common::s3::serve(root.path()).await;
    let ep = server.endpoint();

    let cached = open(&uri(&ep, "tar", "&cache_bytes=1048576")).await;
    let direct = open(&uri(&ep, "tar", "&cache_bytes=0")).await;
    std::fs::remove_file(dir.join("shard-0001.tar")).unwrap();
    let gone = 5; // the second sample of shard 1

    let (a, b) = futures::join!(cached.get(gone), cached.get(gone));
    let (a, b) = (a.unwrap_err(), b.unwrap_err());
    let direct = direct.get(gone).await.unwrap_err();
    for e in [&a, &b, &direct] {
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e:?}");
        assert!(!e.is_retryable(), "{e:?}");
        assert!(e.to_string().contains("shard-0001.tar"), "{e}");
    }
    // What makes this test worth having: the cached reads did go through the shared fetch.
    assert!([&a, &b].iter().any(|e| matches!(e, Error::Shared(_))), "{a:?} / {b:?}");
    // The other shards still read.
    assert_eq!(cached.get(9).await.unwrap(), samples[9]);
}

/// A transform that fails or panics is the caller's code, not Stoker's: `Callback`, with the
/// transform's own words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_panicking_transform_is_a_callback_error() {
    use stoker::loader::{Loader, LoaderConfig};
    let dir = tempfile::tempdir().unwrap();
    objects_dir(dir.path());
    let src = open(dir.path().to_str().unwrap()).await;
    for (fail, words) in [(true, "no labels for this one"), (false, "the transform blew up")] {
        let mut cfg = LoaderConfig::new(2);
        cfg.transform = Some(std::sync::Arc::new(move |_: stoker::Sample| -> stoker::Result<stoker::Sample> {
            if fail {
                return Err(Error::callback("my labeller", "no labels for this one"));
            }
            panic!("the transform blew up");
        }));
        let loader = Loader::new(src.clone(), cfg).unwrap();
        let mut stream = loader.epoch(0).unwrap();
        let e = stream.next_batch().await.unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Callback, "{e:?}");
        assert!(e.to_string().contains(words), "{e}");
        assert!(!e.is_retryable(), "{e:?}");
    }
}

#[test]
fn kinds_look_through_sharing_and_retryable_errors_are_io_or_remote() {
    let missing = Error::NotFound { what: "s3://b/x".into(), hint: None };
    let shared = Error::Shared(std::sync::Arc::new(Error::Shared(std::sync::Arc::new(missing))));
    assert_eq!(shared.kind(), ErrorKind::NotFound);
    let transient = Error::Fetch {
        object: "s3://b/x".into(),
        what: "bytes 0-9".into(),
        attempts: 3,
        message: "503".into(),
        hint: None,
        transient: true,
    };
    let shared = Error::Shared(std::sync::Arc::new(transient));
    assert_eq!((shared.kind(), shared.is_retryable()), (ErrorKind::Remote, true));
    let invalid = Error::InvalidOption { message: "x".into() };
    assert_eq!((invalid.kind(), invalid.is_retryable()), (ErrorKind::InvalidInput, false));
}
