//! The rewrite rules. Each is named; `passes/RULES.md` lists them with their identities.
//!
//! Rules rewrite *placement*, not arithmetic: a fused unit still runs every op it covers,
//! in training mode (BatchNormalization keeps its batch statistics and parameters, Dropout
//! keeps drawing masks). Only the folding of known values removes work (and an Identity of a
//! weight, which the e-graph's construction takes as the weight itself).

use std::sync::Arc;

use egg::{
    Applier, EGraph, Id, Pattern, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var,
};

use ralpc_ir::Joins;

use super::lang::{Folding, Term};

type Graph = EGraph<Term, Folding>;

/// All rules, in a fixed order.
pub fn all() -> Vec<Rewrite<Term, Folding>> {
    let mut rules = Vec::new();
    // Add(MatMul(a, W), b) = Gemm(a, W, b) for 2-D a, 2-D weight W and bias b of W's width.
    for (name, pattern) in [
        ("gemm-from-matmul-add", "(Add (MatMul ?a ?w) ?b)"),
        ("gemm-from-add-matmul", "(Add ?b (MatMul ?a ?w))"),
    ] {
        let pattern: Pattern<Term> = pattern.parse().expect("rule patterns parse");
        rules.push(Rewrite::new(name, pattern, Gemm).expect("rule is well-formed"));
    }
    // f(P(..)) = [P+f](..) for an activation f and a producer P read only by f.
    rules.push(fusion("fuse-activation", Joins::Activation, Others::None));
    // P(..) ⊕ c = [P+⊕](.., c) for a constant c (a bias, a scale) of P's output shape or
    // smaller, and P read only by ⊕.
    rules.push(fusion("fuse-bias", Joins::Arithmetic, Others::Constant));
    // P(..) ⊕ y = [P+⊕](.., y) for an activation y (a residual) broadcast into P's shape,
    // and P read only by ⊕.
    rules.push(fusion(
        "fuse-elementwise",
        Joins::Arithmetic,
        Others::Activation,
    ));
    // Dropout(P(..)) = [P+Dropout](..): the mask is still drawn in training.
    rules.push(fusion("fuse-dropout", Joins::Dropout, Others::None));
    // view(P(..), shape) = [P+view](.., shape) for a reshape that moves no data.
    rules.push(fusion("fuse-view", Joins::View, Others::Constant));
    rules
}

/// The most ops one fused unit covers. Without a bound, a chain of n elementwise ops
/// holds a fused unit for every stretch of it (n² of them, n ops each): a 1,000-ReLU
/// chain took 3 GB to plan. Real fusions (a convolution with its normalization, activation
/// and residual add; a decomposed GELU) are far shorter.
const MAX_UNIT_OPS: usize = 16;

fn fusion(name: &'static str, joins: Joins, others: Others) -> Rewrite<Term, Folding> {
    Rewrite::new(name, JoinSearcher { joins }, Fuse { others }).expect("rule is well-formed")
}

/// How the single op of a one-op unit joins its producer's unit ([`ralpc_ir::OpFacts::joins`]);
/// `None` for other terms.
fn joins(egraph: &Graph, term: &Term) -> Option<Joins> {
    match term {
        Term::Unit { members, .. } => match **members {
            [only] => Some(egraph.analysis.facts.joins[only as usize]),
            _ => None,
        },
        _ => None,
    }
}

/// Matches every class holding a single-op unit that joins its producer as `joins`.
struct JoinSearcher {
    joins: Joins,
}

impl Searcher<Term, Folding> for JoinSearcher {
    fn search_eclass_with_limit(
        &self,
        egraph: &Graph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, Term>> {
        let found = egraph[eclass]
            .nodes
            .iter()
            .any(|n| joins(egraph, n) == Some(self.joins));
        (found && limit > 0).then(|| SearchMatches {
            eclass,
            substs: vec![Subst::default()],
            ast: None,
        })
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

/// What a fused op's other inputs must be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Others {
    /// It has no other inputs.
    None,
    /// Constants (weights, folded values).
    Constant,
    /// At least one activation.
    Activation,
}

struct Fuse {
    others: Others,
}

fn shape_of(egraph: &Graph, class: Id) -> Option<&Vec<u64>> {
    let v = egraph[class].data.value?;
    egraph.analysis.facts.shape[v as usize].as_ref()
}

impl Applier<Term, Folding> for Fuse {
    fn apply_one(
        &self,
        egraph: &mut Graph,
        eclass: Id,
        _subst: &Subst,
        _ast: Option<&PatternAst<Term>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let consumers: Vec<Term> = egraph[eclass].nodes.clone();
        let mut fused = Vec::new();
        for consumer in &consumers {
            let Term::Unit {
                op,
                members,
                children,
            } = consumer
            else {
                continue;
            };
            if members.len() != 1 {
                continue;
            }
            for (i, &producer_class) in children.iter().enumerate() {
                let producer_class = egraph.find(producer_class);
                let data = &egraph[producer_class].data;
                if data.derived || data.uses != 1 {
                    continue;
                }
                let others: Vec<Id> = children
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(_, &c)| egraph.find(c))
                    .collect();
                let constant = |c: &Id| egraph[*c].data.derived;
                let ok = match self.others {
                    Others::None => others.is_empty(),
                    Others::Constant => others.iter().all(constant),
                    Others::Activation => !others.is_empty() && !others.iter().all(constant),
                };
                // An elementwise op that broadcasts its producer up is not a chain.
                let same_shape = matches!(self.others, Others::None)
                    || joins(egraph, consumer) == Some(Joins::View)
                    || shape_of(egraph, producer_class) == shape_of(egraph, eclass);
                if !ok || !same_shape {
                    continue;
                }
                for producer in &egraph[producer_class].nodes {
                    let Term::Unit {
                        op: p_op,
                        members: p_members,
                        children: p_children,
                    } = producer
                    else {
                        continue;
                    };
                    if p_members.len() + members.len() > MAX_UNIT_OPS {
                        continue;
                    }
                    fused.push(Term::Unit {
                        op: Arc::from(format!("{p_op}+{op}")),
                        members: p_members.iter().chain(members.iter()).copied().collect(),
                        children: p_children
                            .iter()
                            .copied()
                            .chain(others.iter().copied())
                            .collect(),
                    });
                }
            }
        }
        union_all(egraph, eclass, fused)
    }
}

fn union_all(egraph: &mut Graph, eclass: Id, terms: Vec<Term>) -> Vec<Id> {
    let mut changed = Vec::new();
    for term in terms {
        let id = egraph.add(term);
        if egraph.union(eclass, id) {
            changed.push(id);
        }
    }
    changed
}

/// Builds `Gemm(a, W, b)` from a matched `Add(MatMul(a, W), b)`.
struct Gemm;

impl Applier<Term, Folding> for Gemm {
    fn apply_one(
        &self,
        egraph: &mut Graph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Term>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let var = |name: &str| name.parse::<Var>().expect("variable name");
        let (Some(&a), Some(&w), Some(&b)) = (
            subst.get(var("?a")),
            subst.get(var("?w")),
            subst.get(var("?b")),
        ) else {
            return Vec::new();
        };
        let (a, w, b) = (egraph.find(a), egraph.find(w), egraph.find(b));
        let (Some(a_shape), Some(w_shape), Some(b_shape)) = (
            shape_of(egraph, a),
            shape_of(egraph, w),
            shape_of(egraph, b),
        ) else {
            return Vec::new();
        };
        let width = w_shape.get(1).copied();
        let bias_fits = matches!(b_shape.as_slice(), [n] | [1, n] if Some(*n) == width);
        if a_shape.len() != 2
            || w_shape.len() != 2
            || !bias_fits
            || !egraph[w].data.derived
            || !egraph[b].data.derived
        {
            return Vec::new();
        }
        let mut terms = Vec::new();
        for add in &egraph[eclass].nodes {
            let Term::Unit {
                op,
                members: add_members,
                children,
            } = add
            else {
                continue;
            };
            if &**op != "Add" || children.len() != 2 {
                continue;
            }
            let ids: Vec<Id> = children.iter().map(|&c| egraph.find(c)).collect();
            let Some(&matmul_class) = ids.iter().find(|&&c| c != b) else {
                continue;
            };
            if !ids.contains(&b) || egraph[matmul_class].data.uses != 1 {
                continue;
            }
            for matmul in &egraph[matmul_class].nodes {
                let Term::Unit {
                    op,
                    members,
                    children,
                } = matmul
                else {
                    continue;
                };
                let operands: Vec<Id> = children.iter().map(|&c| egraph.find(c)).collect();
                if &**op == "MatMul" && operands == [a, w] {
                    terms.push(Term::Unit {
                        op: Arc::from("Gemm"),
                        members: members.iter().chain(add_members.iter()).copied().collect(),
                        children: Box::new([a, w, b]),
                    });
                }
            }
        }
        union_all(egraph, eclass, terms)
    }
}
