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
