//! Tied weights (an embedding table the LM head reuses). A rank whose layers all read the
//! same rows of one keeps those rows alone, as Megatron keeps a vocabulary piece shared by
//! the first stage's embedding and the last stage's head; other ranks keep it whole, each
//! layer reading the piece its split gives it, and the piece's gradient is added at its
//! place. The holders' gradients are summed at their place in the whole table. All of it
//! is done where the weight is: on a device, cut and added there, so the table never
//! crosses to the host.

use super::super::region::{positions_in, Piece};
use super::super::tensor::numel;
use super::failure::bug;
use super::*;

impl Prepared<'_> {
    /// How rank `rank` keeps tied weight `w`: the rows every one of its layers reading `w`
    /// reads when they read the same ones, else whole.
    pub(super) fn tied_holding(&self, rank: u32, w: ValueId) -> Slice {
        let mut held: Option<Slice> = None;
        for l in self.layers.iter().filter(|l| l.weights.contains(&w)) {
            let Some(k) = l.holds(rank) else {
                continue;
            };
            let rows = match self.slice_of(l, k, w) {
                // The same rows; the zero row is made where the lookup reads it.
                Slice::Vocabulary(piece) => Slice::Axis(0, piece),
                Slice::Axis(0, piece) => Slice::Axis(0, piece),
                _ => return Slice::Whole,
            };
            match &held {
                Some(h) if *h != rows => return Slice::Whole,
                _ => held = Some(rows),
            }
        }
        held.unwrap_or(Slice::Whole)
    }
}

impl Rank<'_, '_> {
    /// Where this rank's rows of tied weight `w` lie in the whole table; `None` when it
    /// holds the whole.
    fn tied_rows(&self, w: ValueId) -> Result<Option<Piece>, RankError> {
        let (slice, _) = self.weights.get(&w).ok_or_else(|| {
            bug(format!(
                "the tied weight '{}' is not held",
                self.value_name(w)
            ))
        })?;
        Ok(slice.piece(&self.tied_shape(w)?))
    }

    /// The whole shape of tied weight `w`.
    fn tied_shape(&self, w: ValueId) -> Result<Vec<usize>, RankError> {
        self.p
            .exe
            .weights
            .tensors
            .get(&w)
            .map(|t| t.shape.clone())
            .ok_or_else(|| {
                bug(format!(
                    "the tied weight '{}' is missing",
                    self.value_name(w)
                ))
            })
    }

    /// Layer `l`'s piece (on rank index `k`) of tied weight `w`, of which this rank holds
    /// `held`: all of its rows when the rank keeps rows (with a vocabulary piece's zero
    /// row after them), else cut from the whole.
    pub(super) fn tied_piece(
        &self,
        l: &LayerExec,
        k: u32,
        w: ValueId,
        held: &Tensor,
    ) -> Result<Tensor, RankError> {
        let slice = self.p.slice_of(l, k, w);
        if self.tied_rows(w)?.is_some() {
            let piece = slice.piece(&self.tied_shape(w)?);
            let Some(piece) = piece.filter(|p| p.zero_row) else {
                return Ok(held.clone());
            };
            let Data::F32(f) = &held.data else {
                return Err(bug("a tied weight that is not floats"));
            };
            let padded = match self.with_zero_row(&piece, f.clone())? {
                Some(padded) => padded,
                None => {
                    let mut rows = f.to_vec();
                    rows.resize(numel(&piece.held_shape()), 0.0);
                    rows.into()
                }
            };
            return Ok(Tensor {
                shape: piece.held_shape(),
                data: Data::F32(padded),
            });
        }
        let whole = held;
        let on_host = || share(whole, &slice, l.first_slice(k));
        let (Some(piece), Data::F32(f)) = (slice.piece(&whole.shape), &whole.data) else {
            return Ok(on_host());
        };
        let Some(cut) = self.compute.crop(f, &piece.whole(), &piece.region)? else {
            return Ok(on_host());
        };
        let cut = match piece.zero_row {
            true => match self.with_zero_row(&piece, cut)? {
                Some(padded) => padded,
                None => return Ok(on_host()),
            },
            false => cut,
        };
        Ok(Tensor {
            shape: piece.held_shape(),
            data: Data::F32(cut),
        })
    }

    /// A vocabulary piece's rows `rows` (resident on the device) with the zero row after
    /// them, made on the device; `None` when it cannot.
    fn with_zero_row(&self, piece: &Piece, rows: Floats) -> Result<Option<Floats>, RankError> {
        let held = piece.held_shape();
        let zeros = self.compute.zeros(numel(&held))?;
        let holder: Region = held.iter().map(|&d| 0..d).collect();
        let region: Region = piece.shape.iter().map(|&d| 0..d).collect();
        Ok(self
            .compute
            .accumulate(zeros, &holder, &region, &rows)?
            .ok())
    }

    /// Adds `gw`, layer `l`'s gradient of its piece (on rank index `k`) of tied weight `w`,
    /// at its place in this rank's gradient of the whole weight (`counted`: this replica
    /// counts the layer's gradients; the others add zeros).
    pub(super) fn add_tied_gradient(
        &mut self,
        l: &LayerExec,
        k: u32,
        w: ValueId,
        gw: Floats,
        counted: bool,
    ) -> Result<(), RankError> {
        let shape = self.tied_shape(w)?;
        let held_rows = self.tied_rows(w)?;
        let n = held_rows
            .as_ref()
            .map_or(numel(&shape), |p| numel(&p.shape));
        let total = match self.grads.remove(&w) {
            Some(total) => total,
            None => self.compute.zeros(n)?,
        };
        if !counted {
            self.grads.insert(w, total);
            return Ok(());
        }
        let slice = self.p.slice_of(l, k, w);
        let Some(piece) = slice.piece(&shape) else {
            let sum = self.compute.add(total, &gw)?;
            self.grads.insert(w, sum);
            return Ok(());
        };
        // The piece's own rows: a vocabulary piece's zero row gathered nothing of the
        // table.
        let part = match piece.zero_row {
            false => gw,
            true => {
                let held: Region = piece.held_shape().iter().map(|&d| 0..d).collect();
                let rows: Region = piece.shape.iter().map(|&d| 0..d).collect();
                match self.compute.crop(&gw, &held, &rows)? {
                    Some(rows) => rows,
                    None => gw
                        .get(..numel(&piece.shape))
                        .map(|rows| Floats::from(rows.to_vec()))
                        .ok_or_else(|| {
                            bug("a vocabulary piece's gradient is shorter than its rows")
                        })?,
                }
            }
        };
        if held_rows.is_some() {
            // The layer's piece is all of the rows this rank keeps.
            let sum = self.compute.add(total, &part)?;
            self.grads.insert(w, sum);
            return Ok(());
        }
        let sum = self.add_at(total, &piece, &part)?;
        self.grads.insert(w, sum);
        Ok(())
    }

    /// `total` (the whole of `piece`'s holder) with `part` added over `piece`'s box, where
    /// `total` is: on the device when resident there, else on the host.
    fn add_at(&self, total: Floats, piece: &Piece, part: &Floats) -> Result<Floats, RankError> {
        Ok(
            match self
                .compute
                .accumulate(total, &piece.whole(), &piece.region, part)?
            {
                Ok(sum) => sum,
                Err(mut total) => {
                    let t = total.make_mut();
                    for (i, v) in positions_in(&piece.whole(), &piece.region).zip(part.iter()) {
                        t[i] += v;
                    }
                    total
                }
            },
        )
    }

    /// Tied weight `w`'s gradient `g` (of the rows this rank keeps, or whole) at its place
    /// in a gradient of the whole table, zero elsewhere, and where the rows lie (`None`:
    /// it was whole).
    pub(super) fn tied_gradient_in_whole(
        &self,
        w: ValueId,
        g: Floats,
    ) -> Result<(Floats, Option<Piece>), RankError> {
        let Some(piece) = self.tied_rows(w)? else {
            return Ok((g, None));
        };
        let zeros = self.compute.zeros(numel(&piece.holder))?;
        let whole = self.add_at(zeros, &piece, &g)?;
        Ok((whole, Some(piece)))
    }

    /// The rows `piece` of a whole table's gradient `whole`, cut where it is.
    pub(super) fn tied_rows_of(&self, whole: &Floats, piece: &Piece) -> Result<Floats, RankError> {
        if let Some(rows) = self.compute.crop(whole, &piece.whole(), &piece.region)? {
            return Ok(rows);
        }
        Ok(positions_in(&piece.whole(), &piece.region)
            .map(|i| whole.get(i).copied().unwrap_or(0.0))
            .collect::<Vec<f32>>()
            .into())
    }
}
