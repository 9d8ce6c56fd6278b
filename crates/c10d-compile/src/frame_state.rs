//! What a rank observed about a frame's inputs while tracing it (Dynamo's "automatic dynamic"
//! frame state), and how two observations merge.
//!
//! Every input is either an integer or a tensor's sizes. Each value starts static (the number
//! seen); merging two observations keeps a value static only where both agree and marks
//! everything else [`Dim::Dynamic`]:
//! - ints: equal → static, else dynamic;
//! - tensor sizes: per dimension as ints; a different number of dimensions makes the whole size
//!   [`Sizes::DynamicRank`];
//! - an int on one side and a tensor on the other → [`InputState::Dynamic`].
//!
//! Merging is commutative and associative, so the order of ranks does not matter and every rank
//! that folds the same set of states gets the same result.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One integer value (a scalar input or one tensor dimension).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dim {
    /// Traced as this constant.
    Static(i64),
    /// Traced as a symbol (differs between observations).
    Dynamic,
}

impl Dim {
    /// Static where both agree, else dynamic.
    pub fn merge(self, other: Dim) -> Dim {
        match (self, other) {
            (Dim::Static(a), Dim::Static(b)) if a == b => Dim::Static(a),
            _ => Dim::Dynamic,
        }
    }

    /// True when a value `v` satisfies this dimension's guard.
    pub fn admits(self, v: i64) -> bool {
        match self {
            Dim::Static(s) => s == v,
            Dim::Dynamic => true,
        }
    }

    /// True for [`Dim::Dynamic`].
    pub fn is_dynamic(self) -> bool {
        self == Dim::Dynamic
    }
}

/// A tensor input's sizes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Sizes {
    /// One entry per dimension.
    Dims(Vec<Dim>),
    /// The number of dimensions differs between observations.
    DynamicRank,
}

/// What is known about one input.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InputState {
    /// An integer input.
    Int(Dim),
    /// A tensor input.
    Tensor(Sizes),
    /// An int in some observations and a tensor in others: nothing about it is static.
    Dynamic,
}

impl InputState {
    /// A static int.
    pub fn int(v: i64) -> InputState {
        InputState::Int(Dim::Static(v))
    }

    /// A tensor with these static sizes.
    pub fn tensor(sizes: &[usize]) -> InputState {
        InputState::Tensor(Sizes::Dims(
            sizes.iter().map(|&s| Dim::Static(s as i64)).collect(),
        ))
    }

    /// The merge of two observations (see the module docs).
    pub fn merge(&self, other: &InputState) -> InputState {
        use InputState::*;
        match (self, other) {
            (Int(a), Int(b)) => Int(a.merge(*b)),
            (Tensor(Sizes::Dims(a)), Tensor(Sizes::Dims(b))) if a.len() == b.len() => Tensor(
                Sizes::Dims(a.iter().zip(b).map(|(x, y)| x.merge(*y)).collect()),
            ),
            (Tensor(_), Tensor(_)) => Tensor(Sizes::DynamicRank),
            _ => Dynamic,
        }
    }

    /// True when a concrete observation `seen` passes this state's guards (a compiled graph
    /// specialised on this state can run it).
    pub fn admits(&self, seen: &InputState) -> bool {
        use InputState::*;
        match (self, seen) {
            (Dynamic, _) => true,
            (Int(d), Int(Dim::Static(v))) => d.admits(*v),
            (Int(d), Int(Dim::Dynamic)) => d.is_dynamic(),
            (Tensor(Sizes::DynamicRank), Tensor(_)) => true,
            (Tensor(Sizes::Dims(a)), Tensor(Sizes::Dims(b))) => {
                a.len() == b.len()
                    && a.iter().zip(b).all(|(x, y)| match y {
                        Dim::Static(v) => x.admits(*v),
                        Dim::Dynamic => x.is_dynamic(),
                    })
            }
            _ => false,
        }
    }
}

/// One rank's state for one frame: the frame's identity and each input by source name
/// (e.g. `"L['x']"`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FrameState {
    /// Identifies the code being compiled (e.g. `"forward@model.py:12"`); ranks must agree.
    pub frame: String,
    /// Inputs by source name.
    pub inputs: BTreeMap<String, InputState>,
}

impl FrameState {
    /// An empty state for `frame`.
    pub fn new(frame: impl Into<String>) -> FrameState {
        FrameState {
            frame: frame.into(),
            inputs: BTreeMap::new(),
        }
    }

    /// Adds (replaces) an integer input.
    pub fn with_int(mut self, name: impl Into<String>, v: i64) -> FrameState {
        self.inputs.insert(name.into(), InputState::int(v));
        self
    }

    /// Adds (replaces) a tensor input with static sizes.
    pub fn with_tensor(mut self, name: impl Into<String>, sizes: &[usize]) -> FrameState {
        self.inputs.insert(name.into(), InputState::tensor(sizes));
        self
    }

    /// Merges `other` into `self` input by input. Inputs present on one side only are kept as
    /// they are (the compiler collective refuses such states before merging).
    pub fn merge_from(&mut self, other: &FrameState) {
        for (k, v) in &other.inputs {
            match self.inputs.get_mut(k) {
                Some(mine) => *mine = mine.merge(v),
                None => {
                    self.inputs.insert(k.clone(), v.clone());
                }
            }
        }
    }

    /// True when every input of `seen` passes this state's guards (same input names).
    pub fn admits(&self, seen: &FrameState) -> bool {
        self.inputs.len() == seen.inputs.len()
            && seen
                .inputs
                .iter()
                .all(|(k, v)| self.inputs.get(k).is_some_and(|s| s.admits(v)))
    }

    /// Names of the inputs that are (wholly or partly) dynamic.
    pub fn dynamic_inputs(&self) -> Vec<&str> {
        self.inputs
            .iter()
            .filter(|(_, v)| match v {
                InputState::Int(d) => d.is_dynamic(),
                InputState::Tensor(Sizes::Dims(ds)) => ds.iter().any(|d| d.is_dynamic()),
                InputState::Tensor(Sizes::DynamicRank) | InputState::Dynamic => true,
            })
            .map(|(k, _)| k.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_rules() {
        let a = InputState::tensor(&[5, 4]);
        let b = InputState::tensor(&[6, 4]);
        assert_eq!(
            a.merge(&b),
            InputState::Tensor(Sizes::Dims(vec![Dim::Dynamic, Dim::Static(4)]))
        );
        assert_eq!(
            a.merge(&InputState::tensor(&[5])),
            InputState::Tensor(Sizes::DynamicRank)
        );
        assert_eq!(a.merge(&InputState::int(3)), InputState::Dynamic);
        assert_eq!(
            InputState::int(3).merge(&InputState::int(3)),
            InputState::int(3)
        );
        assert_eq!(
            InputState::int(3).merge(&InputState::int(4)),
            InputState::Int(Dim::Dynamic)
        );
        let m = a.merge(&b);
        assert!(m.admits(&InputState::tensor(&[9, 4])));
        assert!(!m.admits(&InputState::tensor(&[9, 5])));
        assert!(!a.admits(&b));
    }

    #[test]
    fn merge_is_order_independent() {
        let states = [
            InputState::tensor(&[5, 2]),
            InputState::tensor(&[5, 3]),
            InputState::int(1),
        ];
        let fwd = states[1..]
            .iter()
            .fold(states[0].clone(), |a, b| a.merge(b));
        let rev = states[..2]
            .iter()
            .rev()
            .fold(states[2].clone(), |a, b| a.merge(b));
        assert_eq!(fwd, rev);
    }
}
