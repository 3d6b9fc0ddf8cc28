//! LMDB after fork, as in a PyTorch DataLoader worker. Alone in its test binary: forking while
//! other test threads hold locks could hang the child.

mod common;

use common::*;

#[test]
fn lmdb_reads_in_a_forked_child() {
    // A DataLoader worker forks after the parent opened the environment.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_lmdb(dir.path(), &[(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), b"22".to_vec())]);
    let src = rt.block_on(open(dir.path().to_str().unwrap()));
    assert_eq!(rt.block_on(src.get(1)).unwrap().fields[0].data, &b"22"[..]);
    drop(rt);
    // SAFETY: the child only opens, reads with a fresh runtime and exits without returning.
    match unsafe { libc_fork() } {
        0 => {
            let ok = std::panic::catch_unwind(|| {
                let rt = tokio::runtime::Runtime::new().unwrap();
                let again = rt.block_on(stoker::open(dir.path().to_str().unwrap(), Default::default())).unwrap();
                rt.block_on(again.get(0)).unwrap().fields[0].data == b"1"[..]
            });
            std::process::exit(if matches!(ok, Ok(true)) { 0 } else { 1 });
        }
        pid => {
            let mut status = 0;
            unsafe { libc_waitpid(pid, &mut status, 0) };
            assert_eq!(status, 0, "the forked child could not reopen and read the environment");
        }
    }
}

extern "C" {
    #[link_name = "fork"]
    fn libc_fork() -> i32;
    #[link_name = "waitpid"]
    fn libc_waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
}
