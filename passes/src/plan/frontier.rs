//! The layered search's states: which choice each frontier layer took, as hash-consed
//! Patricia trees (Okasaki and Gill, "Fast Mergeable Integer Maps", 1998).
//!
//! A state of the layered search maps every layer on the frontier (an output still read
//! later) to its choice. States after one layer differ from their parents' by a few
//! entries: the layers read for the last time leave, the layer itself joins. As flat
//! vectors a wide frontier (a thousand parallel branches) made every state cost its width
//! at every layer, quadratic in the branches. Here a state is a tree id: removing and
//! adding entries rebuild only the paths to them, equal maps are the same id (every node is
//! made once: a big-endian Patricia tree's shape depends only on its keys, so the same map
//! is always the same tree), and each node knows whether all its layers took one split (the
//! beam keeps those states).

use rustc_hash::FxHashMap as HashMap;

/// A map in a [`Frontiers`] arena.
pub(super) type Id = u32;

/// The empty map.
pub(super) const EMPTY: Id = 0;

/// A node's splits summary: no layer at all.
const NO_SPLIT: u32 = u32::MAX;
/// A node's splits summary: layers on different splits.
const MIXED: u32 = u32::MAX - 1;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Node {
    Empty,
    /// A layer's choice, and that choice's split as a search-wide split id.
    Leaf {
        layer: u32,
        choice: u16,
        split: u16,
    },
    Branch(Fork),
}

/// Layers sharing the bits of `prefix` above `bit`; those with `bit` clear on the left, set
/// on the right (both non-empty).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Fork {
    prefix: u32,
    bit: u32,
    left: Id,
    right: Id,
}

impl Fork {
    /// Whether `layer`'s bits above the fork's are its prefix.
    fn holds(self, layer: u32) -> bool {
        has_prefix(layer, self.prefix, self.bit)
    }

    /// The side `layer` belongs on.
    fn side(self, layer: u32) -> Id {
        if layer & self.bit == 0 {
            self.left
        } else {
            self.right
        }
    }
}

/// An arena of hash-consed maps from layer to choice.
pub(super) struct Frontiers {
    nodes: Vec<Node>,
    /// Per node: the split all its layers took, [`MIXED`] or [`NO_SPLIT`].
    splits: Vec<u32>,
    ids: HashMap<Node, Id>,
    /// Nodes alive after the last compaction.
    live: usize,
}

impl Frontiers {
    pub(super) fn new() -> Frontiers {
        let mut frontiers = Frontiers {
            nodes: Vec::new(),
            splits: Vec::new(),
            ids: HashMap::default(),
            live: 1,
        };
        frontiers.make(Node::Empty);
        frontiers
    }

    fn make(&mut self, node: Node) -> Id {
        if let Some(&id) = self.ids.get(&node) {
            return id;
        }
        let split = match node {
            Node::Empty => NO_SPLIT,
            Node::Leaf { split, .. } => u32::from(split),
            Node::Branch(f) => {
                let (l, r) = (self.splits[f.left as usize], self.splits[f.right as usize]);
                if l == r {
                    l
                } else {
                    MIXED
                }
            }
        };
        // Ids stay below u32::MAX: an arena holds at most a few nodes per state and layer.
        let id = self.nodes.len() as Id;
        self.nodes.push(node);
        self.splits.push(split);
        self.ids.insert(node, id);
        id
    }

    /// A branch of two maps, or the one that is not empty.
    fn branch(&mut self, prefix: u32, bit: u32, left: Id, right: Id) -> Id {
        match (left, right) {
            (EMPTY, _) => right,
            (_, EMPTY) => left,
            _ => self.make(Node::Branch(Fork {
                prefix,
                bit,
                left,
                right,
            })),
        }
    }

    /// The choice `map` holds for `layer`.
    pub(super) fn get(&self, mut map: Id, layer: u32) -> Option<u16> {
        loop {
            match self.nodes[map as usize] {
                Node::Empty => return None,
                Node::Leaf {
                    layer: at, choice, ..
                } => return (at == layer).then_some(choice),
                Node::Branch(f) => {
                    if !f.holds(layer) {
                        return None;
                    }
                    map = f.side(layer);
                }
            }
        }
    }

    /// Whether every layer in `map` took the split `split` (an empty map does).
    pub(super) fn all_on(&self, map: Id, split: u16) -> bool {
        let s = self.splits[map as usize];
        s == NO_SPLIT || s == u32::from(split)
    }

    /// `map` with `layer` taking `choice` (of split id `split`).
    pub(super) fn insert(&mut self, map: Id, layer: u32, choice: u16, split: u16) -> Id {
        let leaf = Node::Leaf {
            layer,
            choice,
            split,
        };
        match self.nodes[map as usize] {
            Node::Empty => self.make(leaf),
            Node::Leaf { layer: at, .. } if at == layer => self.make(leaf),
            Node::Leaf { layer: at, .. } => {
                let leaf = self.make(leaf);
                self.join(layer, leaf, at, map)
            }
            Node::Branch(f) => {
                if !f.holds(layer) {
                    let leaf = self.make(leaf);
                    return self.join(layer, leaf, f.prefix, map);
                }
                let below = self.insert(f.side(layer), layer, choice, split);
                if layer & f.bit == 0 {
                    self.branch(f.prefix, f.bit, below, f.right)
                } else {
                    self.branch(f.prefix, f.bit, f.left, below)
                }
            }
        }
    }

    /// The branch holding maps `a` and `b`, whose layers (`a` holds `ka`, `b` holds `kb`)
    /// first differ at a bit above both maps' own.
    fn join(&mut self, ka: u32, a: Id, kb: u32, b: Id) -> Id {
        let bit = highest_bit(ka ^ kb);
        let prefix = ka & !(bit | (bit - 1));
        if ka & bit == 0 {
            self.branch(prefix, bit, a, b)
        } else {
            self.branch(prefix, bit, b, a)
        }
    }

    /// `map` without the layers of `gone` (sorted). `memo` remembers maps already
    /// projected by the same `gone`, so states sharing subtrees rebuild them once.
    pub(super) fn remove(&mut self, map: Id, gone: &[u32], memo: &mut HashMap<Id, Id>) -> Id {
        if gone.is_empty() {
            return map;
        }
        match self.nodes[map as usize] {
            Node::Empty => EMPTY,
            Node::Leaf { layer, .. } => {
                if gone.binary_search(&layer).is_ok() {
                    EMPTY
                } else {
                    map
                }
            }
            Node::Branch(Fork {
                prefix,
                bit,
                left,
                right,
            }) => {
                // Only the layers of `gone` within this branch's range matter.
                let last = prefix | (bit - 1) | bit;
                let from = gone.partition_point(|&g| g < prefix);
                let to = gone.partition_point(|&g| g <= last);
                if from == to {
                    return map;
                }
                if let Some(&done) = memo.get(&map) {
                    return done;
                }
                let within = &gone[from..to];
                let l = self.remove(left, within, memo);
                let r = self.remove(right, within, memo);
                let out = self.branch(prefix, bit, l, r);
                memo.insert(map, out);
                out
            }
        }
    }

    /// Copies the maps reachable from `roots` into a fresh arena and renumbers the roots,
    /// when the arena has more than doubled since the last copy (so copying costs O(1) per
    /// node made, and the arena stays proportional to the live states).
    pub(super) fn collect(&mut self, roots: &mut [Id]) {
        if self.nodes.len() < 2 * self.live + (1 << 16) {
            return;
        }
        let old = std::mem::replace(self, Frontiers::new());
        // Room for the live maps and as many made before the next copy.
        self.ids.reserve(2 * old.live);
        let mut moved = vec![Id::MAX; old.nodes.len()];
        moved[EMPTY as usize] = EMPTY;
        for root in roots.iter_mut() {
            *root = self.copy(&old, *root, &mut moved);
        }
        self.live = self.nodes.len();
    }

    fn copy(&mut self, old: &Frontiers, id: Id, moved: &mut [Id]) -> Id {
        if moved[id as usize] != Id::MAX {
            return moved[id as usize];
        }
        let node = match old.nodes[id as usize] {
            Node::Branch(f) => Node::Branch(Fork {
                left: self.copy(old, f.left, moved),
                right: self.copy(old, f.right, moved),
                ..f
            }),
            other => other,
        };
        let new = self.make(node);
        moved[id as usize] = new;
        new
    }

    /// Nodes in the arena.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// Whether `key`'s bits above `bit` are `prefix`'s.
fn has_prefix(key: u32, prefix: u32, bit: u32) -> bool {
    key & !(bit | (bit - 1)) == prefix
}

/// The highest set bit of `x` (non-zero).
fn highest_bit(x: u32) -> u32 {
    1 << (31 - x.leading_zeros())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// (layer, choice) inserts and removal sets, applied to a tree and a `BTreeMap`.
    #[derive(Clone, Debug)]
    enum Step {
        Insert(u32, u16),
        Remove(Vec<u32>),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let layer = prop_oneof![0u32..64, any::<u32>()];
        prop::collection::vec(
            prop_oneof![
                (layer.clone(), 0u16..4).prop_map(|(l, c)| Step::Insert(l, c)),
                prop::collection::vec(layer, 0..6).prop_map(|mut gone| {
                    gone.sort_unstable();
                    gone.dedup();
                    Step::Remove(gone)
                }),
            ],
            0..60,
        )
    }

    fn build(frontiers: &mut Frontiers, map: &BTreeMap<u32, u16>) -> Id {
        map.iter()
            .fold(EMPTY, |t, (&l, &c)| frontiers.insert(t, l, c, c))
    }

    proptest! {
        #[test]
        fn trees_behave_as_maps_and_equal_maps_are_one_tree(steps in steps()) {
            let mut frontiers = Frontiers::new();
            let mut tree = EMPTY;
            let mut model = BTreeMap::new();
            for step in steps {
                match step {
                    Step::Insert(l, c) => {
                        tree = frontiers.insert(tree, l, c, c);
                        model.insert(l, c);
                    }
                    Step::Remove(gone) => {
                        tree = frontiers.remove(tree, &gone, &mut HashMap::default());
                        for g in gone {
                            model.remove(&g);
                        }
                    }
                }
                for (&l, &c) in &model {
                    prop_assert_eq!(frontiers.get(tree, l), Some(c));
                }
                prop_assert_eq!(frontiers.get(tree, 12345), model.get(&12345).copied());
                // Built in another order, the same map is the same tree.
                prop_assert_eq!(build(&mut frontiers, &model), tree);
                let one = model.values().next().copied();
                for split in 0..4 {
                    let all = model.values().all(|&c| c == split);
                    prop_assert_eq!(frontiers.all_on(tree, split), all, "{:?}", one);
                }
            }
        }
    }

    #[test]
    fn collecting_keeps_the_live_maps_and_drops_the_rest() {
        let mut frontiers = Frontiers::new();
        let mut kept = EMPTY;
        for layer in 0..40_000u32 {
            let t = frontiers.insert(EMPTY, layer, 1, 1);
            let t = frontiers.insert(t, layer + 1, 2, 2);
            if layer % 1000 == 0 {
                kept = frontiers.insert(kept, layer, 3, 3);
            }
            let _ = t;
        }
        let made = frontiers.len();
        let mut roots = [kept];
        frontiers.collect(&mut roots);
        assert!(frontiers.len() < made / 10, "{} of {made}", frontiers.len());
        for layer in (0..40_000u32).step_by(1000) {
            assert_eq!(frontiers.get(roots[0], layer), Some(3));
        }
        assert_eq!(frontiers.get(roots[0], 1), None);
        // Still one tree per map after the copy.
        let mut again = EMPTY;
        for layer in (0..40_000u32).step_by(1000).rev() {
            again = frontiers.insert(again, layer, 3, 3);
        }
        assert_eq!(again, roots[0]);
    }
}
