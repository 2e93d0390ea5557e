//! A float tensor's elements wherever they are: on the host, resident on a device, or
//! both. A device computing a layer keeps its results resident ([`Floats::resident`]) and
//! reads its operands' device copies; host code reads the elements as a slice, which
//! reads a resident value back once, on first use. So the plan interpreter's messages,
//! regions and shape arithmetic stay host code while a chain of device nodes never leaves
//! the device.

use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Why a device's copy could not be read back.
pub type ReadBackError = Box<dyn std::error::Error + Send + Sync>;

/// A piece of a tensor: the box it holds (a range per axis) and its elements, row-major.
pub type Piece<'a> = (&'a [std::ops::Range<usize>], &'a Floats);

/// A copy of a float tensor's elements held by a device.
pub trait DeviceCopy: Any + Send + Sync {
    /// Element count.
    fn len(&self) -> usize;
    /// Whether it has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The elements, read back to the host (after the work that writes them).
    ///
    /// # Errors
    /// The device failed.
    fn read_back(&self) -> Result<Vec<f32>, ReadBackError>;
    /// Itself, for the device that made it to find its buffer.
    fn as_any(&self) -> &dyn Any;
}

/// The panic payload of a host read of a resident value the device could not read back:
/// a slice has no room for an error, and the interpreter's ranks catch it as the device's
/// failure, not ralpc's.
#[derive(Debug)]
pub struct ReadBackFailed(pub String);

struct Copies {
    /// The host's elements, shared with the values [`Floats::detached`] from these.
    host: OnceLock<Arc<Vec<f32>>>,
    /// A copy per device that holds one (ranks on several devices read one model's
    /// weights).
    devices: Mutex<Vec<Arc<dyn DeviceCopy>>>,
}

impl Copies {
    fn devices(&self) -> MutexGuard<'_, Vec<Arc<dyn DeviceCopy>>> {
        self.devices.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn host(&self) -> &Arc<Vec<f32>> {
        self.host.get_or_init(|| {
            let first = self.devices().first().cloned();
            Arc::new(match first {
                Some(copy) => copy.read_back().unwrap_or_else(|e| {
                    std::panic::panic_any(ReadBackFailed(format!(
                        "cannot read a tensor of {} elements back from the device: {e}",
                        copy.len()
                    )))
                }),
                None => Vec::new(),
            })
        })
    }
}

impl Clone for Copies {
    /// The host's elements, to write (copied then), without the devices' copies (they
    /// would go stale).
    fn clone(&self) -> Copies {
        Copies {
            host: OnceLock::from(self.host().clone()),
            devices: Mutex::default(),
        }
    }
}

/// What [`Floats::released`] holds: an element count.
struct Released(usize);

impl DeviceCopy for Released {
    fn len(&self) -> usize {
        self.0
    }
    fn read_back(&self) -> Result<Vec<f32>, ReadBackError> {
        Err(
            "ralpc released these elements after the forward pass, whose backward pass \
             was declared not to read them (a bug in ralpc: please report it)"
                .into(),
        )
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Float elements, shared: clones are the same elements (and the same copies of them),
/// and writing copies them first ([`Floats::make_mut`]).
#[derive(Clone)]
pub struct Floats(Arc<Copies>);

impl Floats {
    /// Elements held by a device alone.
    pub fn resident(copy: Arc<dyn DeviceCopy>) -> Floats {
        Floats(Arc::new(Copies {
            host: OnceLock::new(),
            devices: Mutex::new(vec![copy]),
        }))
    }

    /// A stand-in for elements released after the forward pass because the backward pass
    /// never reads them ([`ralpc_ir::Op::backward_reads`]): it keeps their count (the
    /// tensor keeps its shape) and holds no memory anywhere. Reading it is a bug in
    /// ralpc, reported as a device read-back failure naming the release.
    pub fn released(len: usize) -> Floats {
        Floats::resident(Arc::new(Released(len)))
    }

    /// Whether these are [`Floats::released`] elements.
    pub fn is_released(&self) -> bool {
        !self.on_host()
            && self
                .device_copy(|c| c.as_any().downcast_ref::<Released>().map(|_| ()))
                .is_some()
    }

    /// Element count, without reading a resident value back.
    pub fn len(&self) -> usize {
        match self.0.host.get() {
            Some(host) => host.len(),
            None => self.0.devices().first().map_or(0, |copy| copy.len()),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What `mine` finds in the first device copy it recognizes (its own device's).
    pub fn device_copy<T>(&self, mine: impl Fn(&Arc<dyn DeviceCopy>) -> Option<T>) -> Option<T> {
        self.0.devices().iter().find_map(mine)
    }

    /// Records `copy` as a device's copy of these elements (an upload of them): the next
    /// reader on that device reads it.
    pub fn keep_on_device(&self, copy: Arc<dyn DeviceCopy>) {
        self.0.devices().push(copy);
    }

    /// Whether the host holds the elements (reading them costs no transfer).
    pub fn on_host(&self) -> bool {
        self.0.host.get().is_some()
    }

    /// The elements to write on the host, copied first when shared; the devices' copies
    /// are dropped (they would go stale).
    pub fn make_mut(&mut self) -> &mut Vec<f32> {
        let copies = Arc::make_mut(&mut self.0);
        copies.host();
        copies.devices().clear();
        match copies.host.get_mut() {
            Some(host) => Arc::make_mut(host),
            None => unreachable!("the host copy was made above"),
        }
    }

    /// The elements, owned (copied when shared).
    pub fn into_vec(self) -> Vec<f32> {
        match Arc::try_unwrap(self.0) {
            Ok(copies) => {
                copies.host();
                copies
                    .host
                    .into_inner()
                    .map(Arc::unwrap_or_clone)
                    .unwrap_or_default()
            }
            Err(shared) => shared.host().to_vec(),
        }
    }

    /// The same elements with a list of device copies of their own: a rank's weight
    /// that starts as the model's, whose uploads (and their memory) go when the rank
    /// steps it, not when the run ends. The host's elements are shared, not copied.
    pub fn detached(&self) -> Floats {
        Floats(Arc::new(Copies {
            host: OnceLock::from(self.0.host().clone()),
            devices: Mutex::default(),
        }))
    }
}

impl Deref for Floats {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.0.host().as_slice()
    }
}

impl Default for Floats {
    /// No elements.
    fn default() -> Floats {
        Floats::from(Vec::new())
    }
}

impl From<Vec<f32>> for Floats {
    fn from(host: Vec<f32>) -> Floats {
        Floats(Arc::new(Copies {
            host: OnceLock::from(Arc::new(host)),
            devices: Mutex::default(),
        }))
    }
}

impl PartialEq for Floats {
    fn eq(&self, other: &Floats) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Floats {
    /// The host's elements; a value only resident is not read back to be printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.host.get() {
            Some(host) => host.fmt(f),
            None => write!(f, "<{} elements on a device>", self.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counted {
        data: Vec<f32>,
        reads: Arc<AtomicUsize>,
    }

    impl DeviceCopy for Counted {
        fn len(&self) -> usize {
            self.data.len()
        }
        fn read_back(&self) -> Result<Vec<f32>, ReadBackError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Ok(self.data.clone())
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    fn resident(data: Vec<f32>) -> (Floats, Arc<AtomicUsize>) {
        let reads = Arc::new(AtomicUsize::new(0));
        let copy = Counted {
            data,
            reads: reads.clone(),
        };
        (Floats::resident(Arc::new(copy)), reads)
    }

    #[test]
    fn a_resident_value_is_read_back_once_on_first_host_read() {
        let (x, reads) = resident(vec![1.0, 2.0, 3.0]);
        assert_eq!(x.len(), 3);
        assert!(!x.on_host());
        assert_eq!(reads.load(Ordering::SeqCst), 0, "the length needs no read");
        let shared = x.clone();
        assert_eq!(&x[..], &[1.0, 2.0, 3.0]);
        assert_eq!(&shared[..], &[1.0, 2.0, 3.0]);
        assert_eq!(reads.load(Ordering::SeqCst), 1, "clones share the read");
        assert!(x.device_copy(|c| Some(c.clone())).is_some());
    }

    #[test]
    fn writing_drops_the_device_copy_and_leaves_clones_alone() {
        let (x, _) = resident(vec![1.0, 2.0]);
        let mut y = x.clone();
        y.make_mut()[0] = 5.0;
        assert_eq!(&y[..], &[5.0, 2.0]);
        assert!(
            y.device_copy(|c| Some(c.clone())).is_none(),
            "the device's copy went stale"
        );
        assert_eq!(&x[..], &[1.0, 2.0]);
        assert!(x.device_copy(|c| Some(c.clone())).is_some());
        assert_eq!(x.into_vec(), vec![1.0, 2.0]);
    }

    #[test]
    fn each_device_keeps_its_own_copy() {
        let x = Floats::from(vec![1.0]);
        let (a, _) = resident(vec![1.0]);
        let (b, _) = resident(vec![1.0]);
        let (a, b) = (
            a.device_copy(|c| Some(c.clone())).unwrap(),
            b.device_copy(|c| Some(c.clone())).unwrap(),
        );
        x.keep_on_device(a.clone());
        x.keep_on_device(b.clone());
        let found = |want: &Arc<dyn DeviceCopy>| {
            let want = Arc::as_ptr(want);
            x.device_copy(|c| std::ptr::addr_eq(Arc::as_ptr(c), want).then_some(()))
                .is_some()
        };
        assert!(found(&a) && found(&b), "both devices find their own");
        assert!(x.on_host(), "the host's copy stays");
    }

    #[test]
    fn a_detached_value_shares_the_elements_but_not_the_device_copies() {
        let model = Floats::from(vec![1.0, 2.0]);
        let (upload, _) = resident(vec![1.0, 2.0]);
        let mine = model.detached();
        mine.keep_on_device(upload.device_copy(|c| Some(c.clone())).unwrap());
        assert!(
            model.device_copy(|c| Some(c.clone())).is_none(),
            "the model keeps none"
        );
        assert!(std::ptr::eq(model.as_ptr(), mine.as_ptr()), "one host copy");
        let mut stepped = mine.clone();
        stepped.make_mut()[0] = 3.0;
        assert_eq!(
            (&model[..], &stepped[..]),
            (&[1.0, 2.0][..], &[3.0, 2.0][..])
        );
    }

    #[test]
    fn a_failed_read_back_panics_with_its_own_payload() {
        struct Broken;
        impl DeviceCopy for Broken {
            fn len(&self) -> usize {
                1
            }
            fn read_back(&self) -> Result<Vec<f32>, ReadBackError> {
                Err("the device is gone".into())
            }
            fn as_any(&self) -> &dyn Any {
                self
            }
        }
        let x = Floats::resident(Arc::new(Broken));
        let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| x[0])).unwrap_err();
        let failure = payload.downcast_ref::<ReadBackFailed>().unwrap();
        assert!(failure.0.contains("the device is gone"), "{}", failure.0);
    }
}
