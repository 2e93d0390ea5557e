//! Typed indices into a [`Graph`](crate::Graph).
//!
//! Ids are plain indices; they are only meaningful for the graph that issued them. Their
//! `Debug` form (`n12`, `v3`) is the one the text IR uses.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub(crate) u32);

        impl $name {
            /// The index as a `usize`, for side tables indexed by this id.
            pub fn index(self) -> usize {
                self.0 as usize
            }

            /// The id at an index taken from [`index`](Self::index) (side tables keyed by
            /// index); meaningful only for the graph that issued it.
            pub fn from_index(index: usize) -> $name {
                $name(u32::try_from(index).expect("graph ids fit in 32 bits"))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    };
}

id_type!(
    /// A node (one operator application) of a graph.
    NodeId,
    "n"
);
id_type!(
    /// A value: one output slot of one node. Graph inputs and weights are nodes too.
    ValueId,
    "v"
);
