//! DLPack export of batch columns (<https://dmlc.github.io/dlpack>): the structs as the spec
//! lays them out, and a capsule that keeps the batch alive while a tensor uses it.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What keeps an exported tensor's memory alive: the batch and the shape array.
struct Keeper {
    _owner: Arc<stoker::batch::Batch>,
    _shape: Vec<i64>,
}

unsafe extern "C" fn dl_deleter(t: *mut DLManagedTensor) {
    if t.is_null() {
        return;
    }
    // SAFETY: `t` and its keeper were made by Box::into_raw in `__dlpack__`; the consumer
    // calls this once.
    unsafe {
        drop(Box::from_raw((*t).manager_ctx as *mut Keeper));
        drop(Box::from_raw(t));
    }
}

const DLTENSOR: &CStr = c"dltensor";

unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with our capsule. A consumer renames it to "used_dltensor" and
    // owns the tensor; only an unconsumed capsule still holds it. PyCapsule_IsValid never
    // raises, and GetPointer is called only with the name it was checked for, so an
    // exception pending while the capsule is collected is left as it is.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let t = pyo3::ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr()) as *mut DLManagedTensor;
            dl_deleter(t);
        }
    }
}

/// A one-dimensional or two-dimensional CPU array of a batch column, for `torch.from_dlpack`
/// and `numpy.from_dlpack` (zero-copy; the batch stays alive while any tensor uses it).
#[pyclass(module = "stoker._stoker", frozen)]
pub(crate) struct DlPack {
    pub(crate) owner: Arc<stoker::batch::Batch>,
    pub(crate) ptr: *mut c_void,
    pub(crate) shape: Vec<i64>,
    pub(crate) code: u8,
    pub(crate) bits: u8,
}

// SAFETY: the pointer is into the batch's immutable buffers, kept alive by `owner`.
unsafe impl Send for DlPack {}
unsafe impl Sync for DlPack {}

impl DlPack {
    /// A `dltensor` capsule of this array: what `__dlpack__` returns, and what a converter that
    /// takes capsules (`torch.from_dlpack`) is handed directly, skipping the protocol's
    /// Python-level negotiation (half of a small batch's cost in the consumer).
    pub(crate) fn capsule(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        // The keeper owns the batch and the shape the tensor points into, until the deleter.
        let keeper = Box::into_raw(Box::new(Keeper { _owner: self.owner.clone(), _shape: self.shape.clone() }));
        // SAFETY: `keeper` was just allocated here and nothing else refers to it yet.
        let shape = unsafe { (*keeper)._shape.as_mut_ptr() };
        let t = Box::into_raw(Box::new(DLManagedTensor {
            dl_tensor: DLTensor {
                // An empty column may have a dangling pointer; consumers never read it.
                data: self.ptr,
                device: DLDevice { device_type: 1, device_id: 0 },
                ndim: self.shape.len() as i32,
                dtype: DLDataType { code: self.code, bits: self.bits, lanes: 1 },
                shape,
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: keeper as *mut c_void,
            deleter: Some(dl_deleter),
        }));
        // SAFETY: `t` is a valid, uniquely owned DLManagedTensor; its shape points into the
        // keeper's vector, which lives until the deleter runs.
        unsafe {
            let cap = pyo3::ffi::PyCapsule_New(t as *mut c_void, DLTENSOR.as_ptr(), Some(capsule_destructor));
            if cap.is_null() {
                dl_deleter(t);
                return Err(PyErr::fetch(py));
            }
            Ok(Bound::from_owned_ptr(py, cap).unbind())
        }
    }

    /// This array for Python: its capsule when `capsules` (what `torch.from_dlpack` takes
    /// directly), else the exporter object (numpy's `from_dlpack` takes only objects with
    /// `__dlpack__`).
    pub(crate) fn handed(self, py: Python<'_>, capsules: bool) -> PyResult<Py<PyAny>> {
        if capsules {
            self.capsule(py)
        } else {
            Ok(Py::new(py, self)?.into_any())
        }
    }

    /// This array [`handed`](Self::handed) to `convert`, and what it gives.
    pub(crate) fn convert(self, py: Python<'_>, convert: &Bound<'_, PyAny>, capsules: bool) -> PyResult<Py<PyAny>> {
        Ok(convert.call1((self.handed(py, capsules)?,))?.unbind())
    }
}

#[pymethods]
impl DlPack {
    #[pyo3(signature = (*_args, **_kwargs))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        _args: &Bound<'_, pyo3::types::PyTuple>,
        _kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        self.capsule(py)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (1, 0)
    }
}
