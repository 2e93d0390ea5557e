//! A kernel launch as data: which kernel of `kernels.cu`, over how many elements or rows,
//! and its arguments in the kernel's order. Generated from the kernel table
//! (`kernel_table.rs`): [`Kernel`] names every kernel, and [`Launch`] has one typed
//! constructor per kernel, so a launch's arguments match its kernel by construction. A
//! device runs any launch through one function ([`super::backend::Backend::launch`]); the
//! checked calls the executor makes are [`super::calls::Kernels`].

use super::kernels::{Strides, Window};

/// How a kernel covers its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// A grid-stride loop over outputs: any number of blocks is correct.
    Elements,
    /// One block per row, reducing in shared memory: blocks of a power-of-two size.
    Rows,
}

/// One argument of a launch, as the kernel takes it.
#[derive(Debug)]
pub enum Arg<'a, B, I> {
    /// `float*`.
    Out(&'a mut B),
    /// `const float*`.
    In(&'a B),
    /// `const float*`, null when absent.
    Optional(Option<&'a B>),
    /// `long long*`.
    OutIndex(&'a mut I),
    /// `const long long*`.
    Index(&'a I),
    /// `long long`.
    I64(i64),
    /// `int`.
    I32(i32),
    /// `float`.
    F32(f32),
    /// `Strides`, by value.
    Strides(Strides),
    /// `Window`, by value.
    Window(Window),
}

/// One launch of a kernel on buffers of type `B` (`f32`) and `I` (`i64`).
#[derive(Debug)]
pub struct Launch<'a, B, I> {
    /// The kernel.
    pub kernel: Kernel,
    /// The elements or rows it covers ([`Kernel::grid`]).
    pub extent: usize,
    /// Its arguments, in the kernel's order.
    pub args: Vec<Arg<'a, B, I>>,
}

/// A parameter kind's Rust type in a launch's constructor.
macro_rules! param_type {
    ($a:lifetime, $b:ident, $i:ident, out) => { &$a mut $b };
    ($a:lifetime, $b:ident, $i:ident, input) => { &$a $b };
    ($a:lifetime, $b:ident, $i:ident, optional) => { Option<&$a $b> };
    ($a:lifetime, $b:ident, $i:ident, out_index) => { &$a mut $i };
    ($a:lifetime, $b:ident, $i:ident, index) => { &$a $i };
    ($a:lifetime, $b:ident, $i:ident, i64) => { i64 };
    ($a:lifetime, $b:ident, $i:ident, i32) => { i32 };
    ($a:lifetime, $b:ident, $i:ident, f32) => { f32 };
    ($a:lifetime, $b:ident, $i:ident, Strides) => { Strides };
    ($a:lifetime, $b:ident, $i:ident, Window) => { Window };
}

/// A parameter kind's [`Arg`].
macro_rules! arg {
    (out, $v:ident) => {
        Arg::Out($v)
    };
    (input, $v:ident) => {
        Arg::In($v)
    };
    (optional, $v:ident) => {
        Arg::Optional($v)
    };
    (out_index, $v:ident) => {
        Arg::OutIndex($v)
    };
    (index, $v:ident) => {
        Arg::Index($v)
    };
    (i64, $v:ident) => {
        Arg::I64($v)
    };
    (i32, $v:ident) => {
        Arg::I32($v)
    };
    (f32, $v:ident) => {
        Arg::F32($v)
    };
    (Strides, $v:ident) => {
        Arg::Strides($v)
    };
    (Window, $v:ident) => {
        Arg::Window($v)
    };
}

/// A launch shape's [`Grid`].
macro_rules! grid {
    (elements) => {
        Grid::Elements
    };
    (rows) => {
        Grid::Rows
    };
}

/// [`Kernel`] and [`Launch`]'s constructors from the table.
macro_rules! kernels_and_launches {
    ($(
        $(#[$doc:meta])*
        $name:ident ( $($arg:ident : $kind:ident),* $(,)? ) over $grid:ident;
    )*) => {
        /// A kernel of `kernels.cu`, named as there.
        #[allow(non_camel_case_types, reason = "named as the kernels in kernels.cu")]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Kernel {
            $( $(#[$doc])* $name, )*
        }

        impl Kernel {
            /// Every kernel, in the source's order.
            pub const ALL: &'static [Kernel] = &[$(Kernel::$name),*];

            /// Every kernel's name, in the source's order.
            pub fn names() -> impl Iterator<Item = &'static str> {
                Kernel::ALL.iter().map(|k| k.name())
            }

            /// Its name in `kernels.cu`.
            pub fn name(self) -> &'static str {
                match self {
                    $( Kernel::$name => stringify!($name), )*
                }
            }

            /// How its launches cover their work.
            pub fn grid(self) -> Grid {
                match self {
                    $( Kernel::$name => grid!($grid), )*
                }
            }
        }

        #[allow(clippy::too_many_arguments, reason = "one parameter per kernel parameter")]
        impl<'a, B, I> Launch<'a, B, I> {
            $(
                $(#[$doc])*
                ///
                /// `extent`: the elements or rows the launch covers.
                pub fn $name(extent: usize, $($arg: param_type!('a, B, I, $kind)),*) -> Self {
                    Launch {
                        kernel: Kernel::$name,
                        extent,
                        args: vec![$(arg!($kind, $arg)),*],
                    }
                }
            )*
        }
    };
}

foreach_kernel!(kernels_and_launches);
