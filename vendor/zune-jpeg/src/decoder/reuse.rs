// stoker: this whole file is Stoker's addition (see PATCHED.md at the crate root).
//
// Buffer reuse across decoders: a decoder borrows its input, so it cannot outlive one image,
// but everything it allocates can. `into_buffers` hands that storage back and
// `new_with_buffers` gives it to the next decoder, so a thread decoding image after image
// allocates only while its buffers still grow to the largest image it has seen.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;
use core::mem::take;

use zune_core::bytestream::ZByteReaderTrait;
use zune_core::options::DecoderOptions;

use super::{JpegDecoder, ScanDecodeState, MAX_COMPONENTS};
use crate::components::Components;
use crate::errors::DecodeErrors;
use crate::huffman::HuffmanTable;

/// Storage a finished [`JpegDecoder`] hands back (see [`JpegDecoder::into_buffers`]) for
/// the next one to draw on (see [`JpegDecoder::new_with_buffers`]): component rows,
/// coefficient buffers, marker and upsampling scratch, scan state, Huffman tables built
/// before. It holds no image data that a decoder reads (every buffer is emptied, its capacity
/// kept; a kept table is used only for an identical definition) and borrows nothing.
#[derive(Default)]
pub struct DecoderBuffers {
    /// The component list (empty; its capacity is what is kept).
    pub(crate) components:        Vec<Components>,
    /// Each component's row buffers, by position in the frame header.
    pub(crate) component_storage: [ComponentStorage; MAX_COMPONENTS],
    pub(crate) marker_body:       Vec<u8>,
    pub(crate) coefficients:      [Vec<i16>; MAX_COMPONENTS],
    pub(crate) scan_coefficients: [Vec<i16>; MAX_COMPONENTS],
    pub(crate) upsampler_scratch: Vec<i16>,
    /// Throwaway planes for the first stripe of a buffered raw pull.
    pub(crate) raw_planes:        [Vec<u8>; MAX_COMPONENTS],
    /// The scan state's box, overwritten rather than reallocated.
    pub(crate) scan_state:        Option<Box<ScanDecodeState>>,
    /// Huffman tables built for earlier images, by their definition (at most
    /// [`HUFFMAN_KEPT`], the oldest replaced first): a dataset's images mostly come from one
    /// encoder with the same tables, and building one (its lookup tables) cost 1% of a
    /// cropped decode. A table is a function of its definition, so a decoder given one gives
    /// the same output.
    pub(crate) huffman:           Vec<(HuffmanKey, HuffmanTable)>,
    /// Tables built since the first: the next to replace is this modulo [`HUFFMAN_KEPT`].
    pub(crate) huffman_built:     usize
}

/// Huffman tables [`DecoderBuffers`] keeps.
pub(crate) const HUFFMAN_KEPT: usize = 8;

/// What a Huffman table is built from: a DHT entry's code-length counts and symbols (unread
/// symbols zero), and how it is built (bit 0 lossless DC, 1 DC, 2 progressive).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct HuffmanKey {
    pub(crate) counts:  [u8; 17],
    pub(crate) symbols: [u8; 256],
    pub(crate) kind:    u8
}

impl DecoderBuffers {
    /// The table for `key`: a clone of the kept one, or `build`'s (then kept).
    pub(crate) fn huffman_table(
        &mut self, key: HuffmanKey, build: impl FnOnce() -> Result<HuffmanTable, DecodeErrors>
    ) -> Result<HuffmanTable, DecodeErrors> {
        if let Some((_, table)) = self.huffman.iter().find(|(k, _)| *k == key) {
            return Ok(table.clone());
        }
        let table = build()?;
        // Replaced in turn, not shifted down: a dataset whose every image has its own tables
        // (optimised Huffman coding) misses every time, and a shift moved all the kept ones.
        let slot = self.huffman_built % HUFFMAN_KEPT;
        self.huffman_built = self.huffman_built.wrapping_add(1);
        match self.huffman.get_mut(slot) {
            Some(kept) => *kept = (key, table.clone()),
            None => self.huffman.push((key, table.clone())),
        }
        Ok(table)
    }
}

/// One component's buffers (see `Components`).
#[derive(Default)]
pub(crate) struct ComponentStorage {
    raw_coeff:               Vec<i16>,
    upsample_dest:           Vec<i16>,
    row_up:                  Vec<i16>,
    row:                     Vec<i16>,
    first_row_upsample_dest: Vec<i16>
}

impl ComponentStorage {
    fn clear(&mut self) {
        self.raw_coeff.clear();
        self.upsample_dest.clear();
        self.row_up.clear();
        self.row.clear();
        self.first_row_upsample_dest.clear();
    }

    fn bytes(&self) -> usize {
        2 * (self.raw_coeff.capacity()
            + self.upsample_dest.capacity()
            + self.row_up.capacity()
            + self.row.capacity()
            + self.first_row_upsample_dest.capacity())
    }
}

impl Components {
    /// Give a new component recycled buffers. They are empty, as a new component's are, so
    /// every size check that initialises a buffer still runs.
    pub(crate) fn use_storage(&mut self, mut storage: ComponentStorage) {
        storage.clear();
        self.raw_coeff = storage.raw_coeff;
        self.upsample_dest = storage.upsample_dest;
        self.row_up = storage.row_up;
        self.row = storage.row;
        self.first_row_upsample_dest = storage.first_row_upsample_dest;
    }

    fn take_storage(&mut self) -> ComponentStorage {
        let mut storage = ComponentStorage {
            raw_coeff:               take(&mut self.raw_coeff),
            upsample_dest:           take(&mut self.upsample_dest),
            row_up:                  take(&mut self.row_up),
            row:                     take(&mut self.row),
            first_row_upsample_dest: take(&mut self.first_row_upsample_dest)
        };
        storage.clear();
        storage
    }
}

impl DecoderBuffers {
    /// Empty every buffer, keeping its capacity.
    fn clear(&mut self) {
        self.components.clear();
        self.component_storage.iter_mut().for_each(ComponentStorage::clear);
        self.marker_body.clear();
        self.coefficients.iter_mut().for_each(Vec::clear);
        self.scan_coefficients.iter_mut().for_each(Vec::clear);
        self.upsampler_scratch.clear();
        self.raw_planes.iter_mut().for_each(Vec::clear);
    }

    /// Bytes of heap storage held (capacities), for callers that bound what they keep.
    pub fn capacity_bytes(&self) -> usize {
        let i16s = |v: &[Vec<i16>]| v.iter().map(|b| 2 * b.capacity()).sum::<usize>();
        self.components.capacity() * core::mem::size_of::<Components>()
            + self.component_storage.iter().map(ComponentStorage::bytes).sum::<usize>()
            + self.marker_body.capacity()
            + i16s(&self.coefficients)
            + i16s(&self.scan_coefficients)
            + 2 * self.upsampler_scratch.capacity()
            + self.raw_planes.iter().map(Vec::capacity).sum::<usize>()
            + self.scan_state.as_ref().map_or(0, |_| core::mem::size_of::<ScanDecodeState>())
            + self.huffman.capacity() * core::mem::size_of::<(HuffmanKey, HuffmanTable)>()
    }
}

impl fmt::Debug for DecoderBuffers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecoderBuffers")
            .field("capacity_bytes", &self.capacity_bytes())
            .finish_non_exhaustive()
    }
}

impl<T> JpegDecoder<T>
where
    T: ZByteReaderTrait
{
    /// A decoder like [`JpegDecoder::new_with_options`] that allocates from `buffers`
    /// (from an earlier decoder's [`into_buffers`](Self::into_buffers), or
    /// `DecoderBuffers::default()`) before it allocates anything new. Output is the same as
    /// a fresh decoder's.
    pub fn new_with_buffers(stream: T, options: DecoderOptions, mut buffers: DecoderBuffers) -> Self {
        buffers.clear();
        let mut decoder = JpegDecoder::new_with_options(stream, options);
        decoder.marker_body_scratch = take(&mut buffers.marker_body);
        decoder.progressive_mcus_buffer = take(&mut buffers.coefficients);
        decoder.progressive_scan_buffer = take(&mut buffers.scan_coefficients);
        decoder.upsampler_scratch = take(&mut buffers.upsampler_scratch);
        // The rest is drawn on where the decoder would allocate it (frame header, scan start,
        // buffered raw pull).
        decoder.recycled = buffers;
        decoder
    }

    /// End this decoder and keep its storage for the next one
    /// ([`new_with_buffers`](Self::new_with_buffers)). Works after an error too.
    pub fn into_buffers(mut self) -> DecoderBuffers {
        let mut buffers = take(&mut self.recycled);
        buffers.marker_body = take(&mut self.marker_body_scratch);
        buffers.coefficients = take(&mut self.progressive_mcus_buffer);
        buffers.scan_coefficients = take(&mut self.progressive_scan_buffer);
        buffers.upsampler_scratch = take(&mut self.upsampler_scratch);
        let mut components = take(&mut self.components);
        for (component, storage) in components.iter_mut().zip(buffers.component_storage.iter_mut()) {
            *storage = component.take_storage();
        }
        if components.capacity() >= buffers.components.capacity() {
            buffers.components = components;
        }
        if let Some(state) = self.scan_state.take() {
            buffers.scan_state = Some(state);
        }
        buffers.clear();
        buffers
    }

    /// Skip APP1 (EXIF, XMP), APP2 (ICC profile, MPF, gain map) and APP13 (IPTC) segments
    /// instead of copying them out: [`icc_profile`](Self::icc_profile),
    /// [`exif`](Self::exif) and the like then return `None`. Pixels do not depend on them
    /// (the Adobe APP14 segment, which they do depend on, is still read). Off by default.
    pub fn set_skip_metadata(&mut self, skip: bool) {
        self.skip_metadata = skip;
    }

    /// Read only the 8x8 blocks of `component` in columns `cols` and rows `rows` (block units
    /// of that component, as laid out in its plane): in single-scan baseline images, the
    /// blocks outside are entropy-decoded (their DC prediction carried on, every check made
    /// as for a decoded block) but neither dequantized nor transformed, and what the output
    /// holds at their samples is unspecified. Progressive and multi-scan images decode every
    /// block. For callers that read a window of the image through the raw iMCU-row pull. Off
    /// (every block) by default; a component index past the frame's is ignored.
    pub fn set_block_window(&mut self, component: usize, cols: core::ops::Range<usize>, rows: core::ops::Range<usize>) {
        if let Some(window) = self.block_windows.get_mut(component) {
            *window = Some(crate::decoder::BlockWindow { cols: (cols.start, cols.end), rows: (rows.start, rows.end) });
        }
    }
}
