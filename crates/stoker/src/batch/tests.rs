use super::*;
use crate::sample::Sample;

fn s(key: &str, fields: &[(&str, &[u8])]) -> Sample {
    Sample {
        key: key.into(),
        fields: fields
            .iter()
            .map(|(n, d)| crate::sample::Field { name: (*n).into(), data: bytes::Bytes::copy_from_slice(d) })
            .collect(),
    }
}

#[test]
fn columns_offsets_dense_and_missing() {
    let pool = BatchPool::new(4);
    // `png` first appears in the second sample and is missing from the first and third.
    let samples = [
        s("a", &[("jpg", b"12345"), ("cls", b"1")]),
        s("b", &[("jpg", b"xy"), ("png", b"P"), ("cls", b"2")]),
        s("c", &[("cls", b"3")]),
    ];
    let b = pool.assemble(0, 0, &[7, 8, 9], &samples);
    assert_eq!(b.len(), 3);
    assert_eq!(b.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(b.indices(), [7, 8, 9]);
    assert_eq!(b.field_names().collect::<Vec<_>>(), ["jpg", "cls", "png"]);
    let jpg = b.field("jpg").unwrap();
    assert_eq!((jpg.get(0).unwrap(), jpg.get(1).unwrap(), jpg.get(2).unwrap()), (&b"12345"[..], &b"xy"[..], &b""[..]));
    assert_eq!((jpg.missing, jpg.len()), (1, 3));
    assert!(jpg.dense().is_none());
    let png = b.field("png").unwrap();
    assert_eq!((png.get(0).unwrap(), png.get(1).unwrap(), png.get(2).unwrap()), (&b""[..], &b"P"[..], &b""[..]));
    assert_eq!((png.missing, png.len()), (2, 3));
    assert_eq!(b.field("cls").unwrap().dense(), Some((&b"123"[..], 1)));
    assert_eq!(b.payload_bytes(), 11);
    assert!(b.field("gif").is_none());
}

#[test]
fn storage_is_recycled_and_abandoned_rows_vanish() {
    let pool = BatchPool::new(2);
    let samples = [s("a", &[("x", &[1u8; 1000])])];
    let first = pool.assemble(0, 0, &[0], &samples);
    let ptr = first.field("x").unwrap().data.as_ptr();
    drop(first);
    assert_eq!(pool.idle(), 1);
    let again = pool.assemble(0, 1, &[0], &samples);
    assert_eq!(again.field("x").unwrap().data.as_ptr(), ptr, "the same buffer is reused");
    drop(again);
    let mut b = pool.builder();
    b.push_sample(0, &samples[0]);
    b.begin(1, "half");
    b.field(&"x".into(), 3).copy_from_slice(b"bad");
    b.abandon_row();
    let partial = b.finish(0, 1);
    assert_eq!((partial.len(), partial.payload_bytes(), partial.keys().collect::<Vec<_>>()), (1, 1000, vec!["a"]));
    drop(partial);
    let other = pool.assemble(0, 2, &[1], &[s("b", &[("y", b"z")])]);
    assert_eq!(other.field_names().collect::<Vec<_>>(), ["y"]);
}

#[test]
fn new_storage_takes_the_size_of_the_last_batch_at_once() {
    let pool = BatchPool::new(1);
    let big = s("a", &[("x", &[7u8; 5000]), ("cls", b"1")]);
    let first = pool.assemble(0, 0, &[0], std::slice::from_ref(&big));
    // `first` is held, so the next batch is built in new storage: its columns start at the
    // sizes `first` finished with, not at the first sample's.
    let mut b = pool.builder();
    b.begin(1, "b");
    b.field(&"x".into(), 10).copy_from_slice(&[1u8; 10]);
    b.field(&"cls".into(), 1).copy_from_slice(b"2");
    assert_eq!(b.shell.columns[0].buf.capacity(), 5000 + 5000 / 8);
    assert_eq!(b.shell.columns[1].buf.capacity(), 1);
    // Growing past it keeps what was written.
    b.begin(2, "c");
    b.field(&"x".into(), 6000).copy_from_slice(&[2u8; 6000]);
    let second = b.finish(0, 1);
    let x = second.field("x").unwrap();
    assert_eq!((x.get(0).unwrap(), x.get(1).unwrap()), (&[1u8; 10][..], &[2u8; 6000][..]));
    assert_eq!(first.field("x").unwrap().get(0).unwrap(), &[7u8; 5000][..]);

    // The size goes with the field, not the column's place: a batch whose first field is
    // `cls` does not give it `x`'s size.
    let mut b = pool.builder();
    b.begin(3, "d");
    b.field(&"cls".into(), 1).copy_from_slice(b"3");
    b.field(&"x".into(), 10).copy_from_slice(&[3u8; 10]);
    assert_eq!(b.shell.columns[0].buf.capacity(), 1);
    assert_eq!(b.shell.columns[1].buf.capacity(), 6010 + 6010 / 8);
    drop(second);
}

/// A batch made before a fork and dropped in the child leaves the parent's pool alone: a
/// parent thread may have held its lock at the fork (here: this thread holds it).
#[test]
#[cfg(target_os = "linux")]
fn a_batch_from_before_a_fork_dropped_in_the_child_does_not_wait_for_its_pool() {
    let pool = BatchPool::new(4);
    let b = pool.assemble(0, 0, &[1], &[s("a", &[("jpg", b"12345")])]);
    let held = pool.free.lock().unwrap();
    let child = crate::fork::in_child(held, move || {
        drop(b);
        true
    });
    assert_eq!(child, Ok(()), "dropping the parent's batch in a forked child");
}

#[test]
fn many_fields_in_any_order_land_in_their_columns() {
    // Rows give their fields in one order, then reversed, then every other one; each field
    // is matched to its column whether or not it comes where the last row's did.
    let names: Vec<String> = (0..3000).map(|i| format!("f{i}")).collect();
    let value = |row: usize, i: usize| format!("{row}:{i}").into_bytes();
    let orders: [Vec<usize>; 3] =
        [(0..3000).collect(), (0..3000).rev().collect(), (0..3000).filter(|i| i % 2 == 0).collect()];
    let samples: Vec<Sample> = orders
        .iter()
        .enumerate()
        .map(|(row, order)| Sample {
            key: format!("k{row}"),
            fields: order
                .iter()
                .map(|&i| crate::sample::Field { name: names[i].as_str().into(), data: value(row, i).into() })
                .collect(),
        })
        .collect();
    let b = BatchPool::new(1).assemble(0, 0, &[0, 1, 2], &samples);
    assert_eq!(b.field_names().count(), 3000);
    for (pass, order) in [(0, (0..3000).collect::<Vec<_>>()), (1, (0..3000).rev().collect())] {
        for i in order {
            let col = b.field(&names[i]).unwrap_or_else(|| panic!("pass {pass}: f{i}"));
            assert_eq!(col.get(0).unwrap(), &value(0, i)[..]);
            assert_eq!(col.get(1).unwrap(), &value(1, i)[..]);
            let third = if i % 2 == 0 { value(2, i) } else { Vec::new() };
            assert_eq!(col.get(2).unwrap(), &third[..], "f{i}");
        }
    }
}

/// A fixed-width column the batch's sizes make too large to allocate is an error naming it
/// and its sizes, not an aborted process; the builder still serves a column that fits.
#[test]
fn a_fixed_column_too_large_to_allocate_is_an_error() {
    let pool = BatchPool::new(1);
    let mut b = pool.builder();
    for i in 0..4 {
        b.begin(i, &format!("k{i}"));
    }
    // 4 rows of 2^61 bytes: 2^63, more than any allocation may be (isize::MAX), whatever the
    // system's overcommit policy.
    let huge = ColumnType::new(Dtype::U8, vec![1 << 61]);
    let e = b.fixed(&"image".into(), &huge).unwrap_err();
    assert_eq!((&*e.name, e.rows, e.row_bytes), ("image", 4, 1 << 61));
    assert!(e.to_string().contains("`image`") && e.to_string().contains("lower the batch size"), "{e}");
    // Rows times a row's bytes past usize.
    let wider = ColumnType::new(Dtype::U8, vec![usize::MAX / 2]);
    assert!(b.fixed(&"x".into(), &wider).is_err());
    let ok = ColumnType::new(Dtype::U8, vec![3]);
    b.fixed(&"label".into(), &ok).unwrap().copy_from_slice(&[1u8; 12]);
    let batch = b.finish(0, 0);
    assert_eq!(batch.field("label").unwrap().dense(), Some((&[1u8; 12][..], 3)));
}
