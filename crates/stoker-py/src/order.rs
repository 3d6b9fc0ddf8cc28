//! `shuffle=` and `shuffle_window=`: the order of each epoch, as the Python API spells it.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyString};
use stoker::sampler::{Order, DEFAULT_SHARD_WINDOW};

/// `True`: a new permutation of all samples each epoch; `False` (or `None`): storage order;
/// `"shards"`: the shard shuffle over windows of `window` shards (default
/// [`DEFAULT_SHARD_WINDOW`]).
pub(crate) fn order(shuffle: Option<&Bound<'_, PyAny>>, window: Option<usize>, seed: u64) -> PyResult<Order> {
    let shards = shuffle.is_some_and(|s| s.cast::<PyString>().is_ok_and(|s| s.to_cow().is_ok_and(|s| s == "shards")));
    let flag = match shuffle {
        None => Some(false),
        Some(s) => s.cast::<PyBool>().ok().map(|b| b.is_true()),
    };
    let shown = || shuffle.map_or(Ok("None".to_string()), |s| s.repr().map(|r| r.to_string()));
    match (flag, shards, window) {
        (_, true, Some(0)) => Err(PyValueError::new_err("shuffle_window must be at least 1 shard")),
        (_, true, w) => Ok(Order::ShardShuffle { seed, window: w.unwrap_or(DEFAULT_SHARD_WINDOW) }),
        (Some(_), _, Some(_)) => Err(PyValueError::new_err(format!(
            "shuffle_window applies to shuffle=\"shards\" only, not shuffle={}",
            shown()?
        ))),
        (Some(true), _, None) => Ok(Order::Shuffle { seed }),
        (Some(false), _, None) => Ok(Order::Sequential),
        (None, false, _) => Err(PyValueError::new_err(format!(
            "shuffle must be True (a new order of all samples each epoch), False (storage order) or \"shards\" \
             (shuffle the shards, and the samples within windows of shuffle_window shards), not {}",
            shown()?
        ))),
    }
}

/// The `cache_block` a Loader reading in this order is opened with when its options do not
/// choose one (`stoker::SourceOptions::for_order`): `None` for the default.
#[pyfunction]
#[pyo3(signature = (shuffle=None, shuffle_window=None))]
pub(crate) fn cache_block_for(
    shuffle: Option<&Bound<'_, PyAny>>,
    shuffle_window: Option<usize>,
) -> PyResult<Option<u64>> {
    Ok(stoker::SourceOptions::default().for_order(&order(shuffle, shuffle_window, 0)?).cache_block)
}
