//! The layouts a build leaves out (the `parquet` and `hdf5` features): opening one is an
//! error naming the feature and what to do, so the rest of the library is the same in every
//! build.

/// A module `$module` whose `open` refuses `$what` for want of feature `$feature`, in place of
/// the layout's own module (the resolver calls `open` alike in every build).
macro_rules! left_out {
    ($module:ident, $feature:literal, $what:literal) => {
        #[cfg(not(feature = $feature))]
        #[doc = concat!($what, ", without the `", $feature, "` feature.")]
        pub(crate) mod $module {
            use std::sync::Arc;

            use crate::error::Result;
            use crate::source::DynSampleSource;
            use crate::store::{ObjectInfo, Store};
            use crate::uri::SourceOptions;

            /// Refused: this build lacks the feature.
            pub(crate) async fn open(
                _: Store,
                _: Vec<ObjectInfo>,
                _: &SourceOptions,
                display: String,
            ) -> Result<Arc<DynSampleSource>> {
                Err(crate::error::Error::without_feature(&display, $what, $feature))
            }
        }
    };
}

left_out!(parquet, "parquet", "Parquet files");
left_out!(hdf5, "hdf5", "HDF5 files");
