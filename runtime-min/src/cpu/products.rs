//! Products of two operands: Gemm and numpy's MatMul, forward and backward. Each
//! operand's gradient is the other's product with the output's.

use ralpc_ir::Gemm;

use super::grad::{grads, InputGrads};
use super::kernels;
use super::ops::{floats, input, operands, optional, R};
use super::tensor::{self as t, Tensor};

pub(crate) fn gemm(g: &Gemm, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    let (&[ar, ac], &[br, bc]) = (a.shape.as_slice(), b.shape.as_slice()) else {
        return Err(operands(format!(
            "Gemm needs matrices, got {:?} and {:?}",
            a.shape, b.shape
        )));
    };
    let (m, k) = if g.trans_a { (ac, ar) } else { (ar, ac) };
    let (k2, n) = if g.trans_b { (bc, br) } else { (br, bc) };
    if k != k2 {
        return Err(operands(format!("inner dimensions {k} and {k2} differ")));
    }
    let mut y = vec![0.0; m * n];
    if let Some(c) = optional(inputs, 2) {
        let cs = floats(c, "C")?;
        if t::broadcast_shapes(&c.shape, &[m, n]).as_deref() != Some(&[m, n][..]) {
            return Err(operands(format!(
                "C {:?} does not broadcast to {m}×{n}",
                c.shape
            )));
        }
        for (o, i) in y.iter_mut().zip(t::broadcast(&c.shape, &[m, n])) {
            *o = g.beta * cs[i];
        }
    }
    kernels::gemm(
        m,
        k,
        n,
        g.alpha,
        floats(a, "A")?,
        g.trans_a,
        floats(b, "B")?,
        g.trans_b,
        1.0,
        &mut y,
    );
    Ok(Tensor::f32(vec![m, n], y))
}

/// numpy `matmul`: 1-d operands are promoted and the batch axes broadcast.
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> R<Tensor> {
    let (ash, bsh) = matmul_shapes(&a.shape, &b.shape)?;
    let (m, k, n) = (ash[ash.len() - 2], ash[ash.len() - 1], bsh[bsh.len() - 1]);
    let batch = t::broadcast_shapes(&ash[..ash.len() - 2], &bsh[..bsh.len() - 2])
        .ok_or_else(|| operands("the batch axes do not broadcast"))?;
    let count = t::numel(&batch);
    let (xa, xb) = (floats(a, "A")?, floats(b, "B")?);
    let mut y = vec![0.0; count * m * n];
    if bsh.len() == 2 {
        // A batch of rows times one matrix (a linear layer): one product, B packed once.
        kernels::gemm(count * m, k, n, 1.0, xa, false, xb, false, 0.0, &mut y);
        let mut shape = batch;
        if a.shape.len() > 1 {
            shape.push(m);
        }
        if b.shape.len() > 1 {
            shape.push(n);
        }
        return Ok(Tensor::f32(shape, y));
    }
    let ia: Vec<usize> = t::broadcast(&ash[..ash.len() - 2], &batch).collect();
    let ib: Vec<usize> = t::broadcast(&bsh[..bsh.len() - 2], &batch).collect();
    // Attention's products (a batch of heads) run in parallel; a large one is also cut
    // into blocks, which idle threads steal. Each product's arithmetic is the same either way.
    use rayon::prelude::*;
    y.par_chunks_mut(m * n).enumerate().for_each(|(i, out)| {
        let (a, b) = (&xa[ia[i] * m * k..], &xb[ib[i] * k * n..]);
        kernels::gemm(m, k, n, 1.0, a, false, b, false, 0.0, out);
    });
    let mut shape = batch;
    if a.shape.len() > 1 {
        shape.push(m);
    }
    if b.shape.len() > 1 {
        shape.push(n);
    }
    Ok(Tensor::f32(shape, y))
}

/// Both operands as (batch…, rows, columns), after promoting 1-d ones.
pub(crate) fn matmul_shapes(a: &[usize], b: &[usize]) -> R<(Vec<usize>, Vec<usize>)> {
    let ash = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let bsh = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    if ash.len() < 2 || bsh.len() < 2 || ash[ash.len() - 1] != bsh[bsh.len() - 2] {
        return Err(operands(format!("shapes {a:?} and {b:?} do not multiply")));
    }
    Ok((ash, bsh))
}

pub(crate) fn gemm_backward(
    g: &ralpc_ir::Gemm,
    inputs: &[Option<&Tensor>],
    dy: &[f32],
) -> R<InputGrads> {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    let (xa, xb) = (floats(a, "A")?, floats(b, "B")?);
    let (m, k) = if g.trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let n = if g.trans_b { b.shape[0] } else { b.shape[1] };
    let mut da = vec![0.0; a.len()];
    if g.trans_a {
        // A is k×m: dA = α·op(B)·dYᵀ.
        kernels::gemm(k, n, m, g.alpha, xb, g.trans_b, dy, true, 0.0, &mut da);
    } else {
        // dA = α·dY·op(B)ᵀ.
        kernels::gemm(m, n, k, g.alpha, dy, false, xb, !g.trans_b, 0.0, &mut da);
    }
    let mut db = vec![0.0; b.len()];
    if g.trans_b {
        // B is n×k: dB = α·dYᵀ·op(A).
        kernels::gemm(n, m, k, g.alpha, dy, true, xa, g.trans_a, 0.0, &mut db);
    } else {
        // dB = α·op(A)ᵀ·dY.
        kernels::gemm(k, m, n, g.alpha, xa, !g.trans_a, dy, false, 0.0, &mut db);
    }
    let mut out = grads(inputs.len());
    out[0] = Some(da);
    out[1] = Some(db);
    if let Some(c) = inputs.get(2).copied().flatten() {
        let scaled: Vec<f32> = dy.iter().map(|v| v * g.beta).collect();
        out[2] = Some(t::unbroadcast(&scaled, &[m, n], &c.shape));
    }
    Ok(out)
}

pub(crate) fn matmul_backward(a: &Tensor, b: &Tensor, dy: &[f32]) -> R<InputGrads> {
    let (ash, bsh) = matmul_shapes(&a.shape, &b.shape)?;
    let (m, k, n) = (ash[ash.len() - 2], ash[ash.len() - 1], bsh[bsh.len() - 1]);
    let (abatch, bbatch) = (&ash[..ash.len() - 2], &bsh[..bsh.len() - 2]);
    let batch = t::broadcast_shapes(abatch, bbatch)
        .ok_or_else(|| operands("the batch axes do not broadcast"))?;
    let (xa, xb) = (floats(a, "A")?, floats(b, "B")?);
    let ia: Vec<usize> = t::broadcast(abatch, &batch).collect();
    let ib: Vec<usize> = t::broadcast(bbatch, &batch).collect();
    let mut da = vec![0.0; xa.len()];
    let mut db = vec![0.0; xb.len()];
    if bbatch.is_empty() && xa.len() == t::numel(&batch) * m * k {
        // A batch of rows times one matrix: dA = dY·Bᵀ and dB = Aᵀ·dY as single products.
        let rows = t::numel(&batch) * m;
        kernels::gemm(rows, n, k, 1.0, dy, false, xb, true, 0.0, &mut da);
        kernels::gemm(k, rows, n, 1.0, xa, true, dy, false, 0.0, &mut db);
        return Ok(vec![Some(da), Some(db)]);
    }
    // Per broadcast batch element, then summed onto the operand's own batch element.
    let mut ta = vec![0.0; m * k];
    let mut tb = vec![0.0; k * n];
    for (i, g) in dy.chunks(m * n).enumerate() {
        kernels::gemm(
            m,
            n,
            k,
            1.0,
            g,
            false,
            &xb[ib[i] * k * n..],
            true,
            0.0,
            &mut ta,
        );
        kernels::add(&mut da[ia[i] * m * k..(ia[i] + 1) * m * k], &ta);
        kernels::gemm(
            k,
            m,
            n,
            1.0,
            &xa[ia[i] * m * k..],
            true,
            g,
            false,
            0.0,
            &mut tb,
        );
        kernels::add(&mut db[ib[i] * k * n..(ib[i] + 1) * k * n], &tb);
    }
    Ok(vec![Some(da), Some(db)])
}
