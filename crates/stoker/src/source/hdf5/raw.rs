//! Where a dataset's values lie: read straight from the file through the store when they
//! are plain numbers stored contiguous ([`Direct`]), and never from other files (HDF5's
//! external storage is refused at open).

use hdf5_reader::{Dataset, Hdf5File};

use super::column::{Column, Kind};
use crate::error::{Error, Result};

/// A dataset of numbers stored contiguous, unfiltered and little-endian (h5py's default for
/// `create_dataset(shape, dtype)`): row `r` is the `row` bytes at `at + r * row` of the file,
/// read as spans through the store (coalesced with its neighbours) instead of through the
/// reader, without a copy.
#[derive(Clone, Copy, Debug)]
pub(super) struct Direct {
    pub(super) at: u64,
    pub(super) row: u64,
}

/// Where the rows of `set` (of column `c`, `rows` rows) lie, when they can be read directly.
pub(super) fn direct(h5: &Hdf5File, set: &Dataset, c: &Column, rows: u64) -> Option<Direct> {
    use hdf5_reader::messages::layout::DataLayout;
    use hdf5_reader::messages::HdfMessage;
    let Kind::Number { size, order, .. } = c.kind else { return None };
    if size > 1 && order != hdf5_reader::ByteOrder::LittleEndian || cfg!(target_endian = "big") {
        return None;
    }
    let row = c.row_bytes()? as u64;
    let header = h5.get_or_parse_header(set.address()).ok()?;
    let mut contiguous = None;
    for m in &header.messages {
        match m {
            HdfMessage::DataLayout(l) => {
                if let DataLayout::Contiguous { address, size } = l.layout {
                    contiguous = Some((address, size));
                }
            }
            // External storage never reaches here: refused at open ([`refuse_external`]).
            HdfMessage::FilterPipeline(_) => return None,
            _ => {}
        }
    }
    let (address, size) = contiguous?;
    let at = address.checked_add(h5.superblock().base_address)?;
    // Unallocated (never written) data reads as fill values: the reader's business.
    let end = at.checked_add(row.checked_mul(rows)?)?;
    (address != u64::MAX && size >= row.checked_mul(rows)? && end <= h5.storage().len()).then_some(Direct { at, row })
}

/// A dataset whose values the file says lie in other files (HDF5's external raw storage,
/// `create_dataset(..., external=[...])`) is refused at open: Stoker reads only the file it was
/// given, through its store (a remote file's neighbours are not fetched, and a local file must
/// not make the reader open paths it names, such as `/etc/shadow` or `../other`).
pub(super) fn refuse_external(h5: &Hdf5File, set: &Dataset, path: &str, shown: &str) -> Result<()> {
    use hdf5_reader::messages::HdfMessage;
    let header = h5.get_or_parse_header(set.address()).map_err(|e| Error::BadIndex {
        path: shown.to_string(),
        reason: format!("dataset `{path}`'s header does not read ({e})"),
    })?;
    if header.messages.iter().any(|m| matches!(m, HdfMessage::ExternalFiles(_))) {
        return Err(Error::NotSupported {
            what: format!(
                "{shown}: dataset `{path}` keeps its values in other files (HDF5 external storage), and Stoker reads \
                 only the file itself; copy the values in (h5py: write the dataset without external=), or leave it out \
                 by naming the others with columns="
            ),
        });
    }
    Ok(())
}

/// Refuse a dataset whose header contradicts itself in a way the reader would otherwise turn
/// into rows that are not in the file (libhdf5 refuses both): a dimension larger than its own
/// maximum (one damaged byte of the dataspace makes 8 rows 64, the 56 past them fill values,
/// or reshapes every row), and a chunk index (a v1 B-tree, what h5py writes by default) naming
/// a chunk off the chunk grid or outside a dataset that cannot grow (the reader skips such a
/// chunk, and the rows it holds read as fill values: zeros where the file holds data).
pub(super) fn refuse_inconsistent(h5: &Hdf5File, set: &Dataset, path: &str, shown: &str) -> Result<()> {
    let damaged = |reason: String| damaged(shown, path, reason);
    let shape = set.shape();
    refuse_past_max(set, path, shown)?;
    use hdf5_reader::messages::layout::DataLayout;
    let DataLayout::Chunked { address, chunk_indexing: None, .. } = set_layout(h5, set, shown, path)? else {
        return Ok(());
    };
    let Some(chunk) = set.chunks() else { return Ok(()) };
    if address == u64::MAX || chunk.len() < shape.len() || chunk.iter().take(shape.len()).any(|&c| c == 0) {
        return Ok(());
    }
    let sb = h5.superblock();
    let leaves = hdf5_reader::btree_v1::collect_btree_v1_leaves_storage(
        h5.storage(),
        address,
        sb.offset_size,
        sb.length_size,
        Some(shape.len() as u32),
        &chunk,
        None,
    )
    .map_err(|e| damaged(format!("dataset `{path}`'s chunk index does not read ({e})")))?;
    // Past the shape is damage only where the dataset cannot grow: a resizable one may keep
    // chunks of a larger extent (the reader leaves them out).
    let fixed = |d: usize| set.max_dims().is_none_or(|m| m.get(d).is_none_or(|&m| m <= shape[d]));
    for (key, _) in &leaves {
        let hdf5_reader::btree_v1::BTreeV1Key::RawData { offsets, .. } = key else {
            return Err(damaged(format!("dataset `{path}`'s chunk index holds a node of another kind")));
        };
        let off_grid = |d: usize| {
            offsets.get(d).is_none_or(|&o| !o.is_multiple_of(u64::from(chunk[d])) || (o >= shape[d] && fixed(d)))
        };
        if (0..shape.len()).any(off_grid) {
            return Err(damaged(format!(
                "dataset `{path}`'s chunk index names a chunk at {:?}, off the chunk grid {:?} or outside the shape {:?}",
                &offsets[..offsets.len().min(shape.len())],
                &chunk[..shape.len()],
                shape
            )));
        }
    }
    Ok(())
}

/// The data layout of `set`, from its header.
fn set_layout(
    h5: &Hdf5File,
    set: &Dataset,
    shown: &str,
    path: &str,
) -> Result<hdf5_reader::messages::layout::DataLayout> {
    use hdf5_reader::messages::HdfMessage;
    let header = h5.get_or_parse_header(set.address()).map_err(|e| Error::BadIndex {
        path: shown.to_string(),
        reason: format!("dataset `{path}`'s header does not read ({e})"),
    })?;
    header
        .messages
        .iter()
        .find_map(|m| match m {
            HdfMessage::DataLayout(l) => Some(l.layout.clone()),
            _ => None,
        })
        .ok_or_else(|| Error::BadIndex { path: shown.to_string(), reason: format!("dataset `{path}` has no layout") })
}

/// Refuse dataset `set` (at `path` in file `shown`) when a dimension is larger than its
/// maximum (see [`refuse_inconsistent`]).
pub(super) fn refuse_past_max(set: &Dataset, path: &str, shown: &str) -> Result<()> {
    let (shape, Some(max)) = (set.shape(), set.max_dims()) else { return Ok(()) };
    match (0..shape.len()).find(|&d| max.get(d).is_some_and(|&m| m != u64::MAX && shape[d] > m)) {
        Some(d) => Err(damaged(
            shown,
            path,
            format!("dataset `{path}`'s dimension {d} is {} where its maximum is {}", shape[d], max[d]),
        )),
        None => Ok(()),
    }
}

/// The error for dataset `path` of file `shown`, damaged as `reason` says.
fn damaged(shown: &str, path: &str, reason: String) -> Error {
    Error::CorruptData {
        shard: shown.to_string(),
        key: String::new(),
        field: path.to_string(),
        reason: format!("{reason}: the file is damaged (libhdf5 refuses it too); write it again"),
    }
}
