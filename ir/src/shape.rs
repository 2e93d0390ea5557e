//! Tensor shapes with symbolic dimensions.
//!
//! A [`Dim`] is an integer monomial: a coefficient times a product of named symbols
//! (`batch`, `2*batch`, `batch*seq`). That is closed under the arithmetic shape inference
//! needs for the ops ralpc models — products (Flatten, Reshape), exact quotients (Reshape's
//! `-1`), and sums of like terms (Concat along the batch axis) — and keeps a model's batch
//! dimension symbolic from import until `--batch` binds it. Arithmetic that leaves the
//! monomials (a convolution's output height over a symbolic input height) returns `None`,
//! and the caller reports which input dimension must be bound.

use std::fmt;
use std::sync::Arc;

/// One dimension: `coeff · Π symᵉ`. A known dimension has no symbols.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    coeff: i64,
    /// Symbols with their exponents, sorted by name, exponents ≥ 1.
    syms: Box<[(Arc<str>, u32)]>,
}

impl Dim {
    /// A known integer.
    pub fn known(value: i64) -> Dim {
        Dim {
            coeff: value,
            syms: Box::new([]),
        }
    }

    /// A named symbol (`batch`, `seq`).
    pub fn sym(name: &str) -> Dim {
        Dim {
            coeff: 1,
            syms: Box::new([(Arc::from(name), 1)]),
        }
    }

    /// The integer, when no symbol is left.
    pub fn as_known(&self) -> Option<i64> {
        self.syms.is_empty().then_some(self.coeff)
    }

    /// The integer as a non-negative size, when known and ≥ 0.
    pub fn as_size(&self) -> Option<u64> {
        self.as_known().and_then(|v| u64::try_from(v).ok())
    }

    /// The symbols this dimension depends on.
    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.syms.iter().map(|(s, _)| &**s)
    }

    /// Whether the dimension is exactly one symbol with coefficient 1.
    pub fn as_symbol(&self) -> Option<&str> {
        match &*self.syms {
            [(s, 1)] if self.coeff == 1 => Some(s),
            _ => None,
        }
    }

    /// Product; `None` on overflow.
    pub fn checked_mul(&self, other: &Dim) -> Option<Dim> {
        let coeff = self.coeff.checked_mul(other.coeff)?;
        if coeff == 0 {
            return Some(Dim::known(0));
        }
        let mut syms: Vec<(Arc<str>, u32)> = self.syms.to_vec();
        for (s, e) in other.syms.iter() {
            match syms.binary_search_by(|(n, _)| n.cmp(s)) {
                Ok(i) => syms[i].1 = syms[i].1.checked_add(*e)?,
                Err(i) => syms.insert(i, (s.clone(), *e)),
            }
        }
        Some(Dim {
            coeff,
            syms: syms.into(),
        })
    }

    /// Exact quotient `self / other`; `None` when it is not a monomial with an integer
    /// coefficient (or `other` is zero).
    pub fn div_exact(&self, other: &Dim) -> Option<Dim> {
        if other.coeff == 0 || self.coeff % other.coeff != 0 {
            return None;
        }
        let mut syms: Vec<(Arc<str>, u32)> = self.syms.to_vec();
        for (s, e) in other.syms.iter() {
            let i = syms.binary_search_by(|(n, _)| n.cmp(s)).ok()?;
            match syms[i].1.checked_sub(*e)? {
                0 => {
                    syms.remove(i);
                }
                left => syms[i].1 = left,
            }
        }
        Some(Dim {
            coeff: self.coeff / other.coeff,
            syms: syms.into(),
        })
    }

    /// Sum, when both are like terms (or either is zero); `None` otherwise or on overflow.
    pub fn checked_add(&self, other: &Dim) -> Option<Dim> {
        if other.coeff == 0 {
            return Some(self.clone());
        }
        if self.coeff == 0 {
            return Some(other.clone());
        }
        if self.syms != other.syms {
            return None;
        }
        let coeff = self.coeff.checked_add(other.coeff)?;
        if coeff == 0 {
            return Some(Dim::known(0));
        }
        Some(Dim {
            coeff,
            syms: self.syms.clone(),
        })
    }

    /// Negation.
    pub fn checked_neg(&self) -> Option<Dim> {
        Some(Dim {
            coeff: self.coeff.checked_neg()?,
            syms: self.syms.clone(),
        })
    }

    /// Difference, under the same rules as [`Dim::checked_add`].
    pub fn checked_sub(&self, other: &Dim) -> Option<Dim> {
        self.checked_add(&other.checked_neg()?)
    }

    /// Replaces every occurrence of symbol `name` by `value`.
    pub fn substitute(&self, name: &str, value: &Dim) -> Option<Dim> {
        let Some(pos) = self.syms.iter().position(|(s, _)| &**s == name) else {
            return Some(self.clone());
        };
        let exp = self.syms[pos].1;
        let mut rest: Vec<_> = self.syms.to_vec();
        rest.remove(pos);
        let mut out = Dim {
            coeff: self.coeff,
            syms: rest.into(),
        };
        for _ in 0..exp {
            out = out.checked_mul(value)?;
        }
        Some(out)
    }
}

impl From<i64> for Dim {
    fn from(v: i64) -> Dim {
        Dim::known(v)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.syms.is_empty() {
            return write!(f, "{}", self.coeff);
        }
        let mut first = true;
        if self.coeff != 1 {
            write!(f, "{}", self.coeff)?;
            first = false;
        }
        for (s, e) in self.syms.iter() {
            if !first {
                f.write_str("*")?;
            }
            first = false;
            f.write_str(s)?;
            if *e > 1 {
                write!(f, "^{e}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A tensor shape: one [`Dim`] per axis (empty for a scalar).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// A shape of known dimensions.
    pub fn known(dims: &[i64]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::known(d)).collect())
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements as a [`Dim`]; `None` on overflow.
    pub fn numel(&self) -> Option<Dim> {
        self.0
            .iter()
            .try_fold(Dim::known(1), |acc, d| acc.checked_mul(d))
    }

    /// Number of elements when every dimension is known; `None` otherwise or on overflow.
    pub fn known_numel(&self) -> Option<u64> {
        self.0
            .iter()
            .try_fold(1u64, |acc, d| acc.checked_mul(d.as_size()?))
    }

    /// The dimensions as known sizes, if all are known.
    pub fn as_sizes(&self) -> Option<Vec<u64>> {
        self.0.iter().map(Dim::as_size).collect()
    }

    /// The dimensions.
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monomial_arithmetic() {
        let b = Dim::sym("batch");
        let s = Dim::sym("seq");
        let bs = b
            .checked_mul(&s)
            .unwrap()
            .checked_mul(&Dim::known(768))
            .unwrap();
        assert_eq!(bs.to_string(), "768*batch*seq");
        assert_eq!(
            bs.div_exact(&Dim::known(768)).unwrap().to_string(),
            "batch*seq"
        );
        assert_eq!(
            bs.div_exact(&s.checked_mul(&Dim::known(768)).unwrap())
                .unwrap(),
            b
        );
        assert!(bs.div_exact(&Dim::known(5)).is_none());
        assert!(b.checked_add(&Dim::known(1)).is_none());
        assert_eq!(b.checked_add(&b).unwrap().to_string(), "2*batch");
        assert_eq!(b.checked_sub(&b).unwrap(), Dim::known(0));
        assert_eq!(
            bs.substitute("batch", &Dim::known(2)).unwrap().to_string(),
            "1536*seq"
        );
        assert_eq!(Dim::known(i64::MAX).checked_mul(&Dim::known(2)), None);
    }

    #[test]
    fn numel_checks_overflow() {
        assert_eq!(Shape::known(&[1 << 40, 1 << 40]).known_numel(), None);
        assert_eq!(Shape::known(&[2, 3, 4]).known_numel(), Some(24));
        assert_eq!(Shape::known(&[]).known_numel(), Some(1));
    }
}
