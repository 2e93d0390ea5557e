//! Tied weights (an embedding table the LM head reuses): every rank holding one keeps it
//! whole, each layer reads the piece its split gives it, and the piece's gradient is added
//! at its place in the whole weight's. Both are done where the weight is: on a device,
//! cut and added there, so the table never crosses to the host.

use super::super::region::{positions_in, Piece};
use super::super::tensor::numel;
use super::*;

impl Rank<'_, '_> {
    /// Layer `l`'s piece (on rank index `k`) of tied weight `w`, which this rank holds
    /// whole as `whole`.
    pub(super) fn tied_piece(
        &self,
        l: &LayerExec,
        k: u32,
        w: ValueId,
        whole: &Tensor,
    ) -> Result<Tensor, RankError> {
        let slice = self.p.slice_of(l, k, w);
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
        let shape = match self.weights.get(&w) {
            Some((_, whole)) => whole.shape.clone(),
            None => {
                return Err(format!("the tied weight '{}' is not held", self.value_name(w)).into())
            }
        };
        let n = numel(&shape);
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
                        .ok_or("a vocabulary piece's gradient is shorter than its rows")?,
                }
            }
        };
        let sum = match self
            .compute
            .accumulate(total, &piece.whole(), &piece.region, &part)?
        {
            Ok(sum) => sum,
            Err(mut total) => {
                let t = total.make_mut();
                for (i, v) in positions_in(&piece.whole(), &piece.region).zip(part.iter()) {
                    t[i] += v;
                }
                total
            }
        };
        self.grads.insert(w, sum);
        Ok(())
    }
}
