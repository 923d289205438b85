//! Who owns which part of a flat buffer.

use serde::{Deserialize, Serialize};

/// `len` consecutive elements of a flat buffer, owned by rank `owner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub len: usize,
    pub owner: usize,
}

/// `n` elements cut into one span per rank, the first `n % world` one element longer (what an
/// all-reduce scatters).
///
/// ```
/// use mindxtrain_trainer::collective::{even_spans, Span};
/// assert_eq!(even_spans(7, 3), vec![Span { len: 3, owner: 0 }, Span { len: 2, owner: 1 }, Span { len: 2, owner: 2 }]);
/// ```
pub fn even_spans(n: usize, world: usize) -> Vec<Span> {
    let world = world.max(1);
    (0..world).map(|owner| Span { len: n / world + usize::from(owner < n % world), owner }).collect()
}

/// The total length of `spans`.
pub(crate) fn total(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.len).sum()
}

/// Elements `rank` owns.
pub(crate) fn owned(spans: &[Span], rank: usize) -> usize {
    spans.iter().filter(|s| s.owner == rank).map(|s| s.len).sum()
}

/// `(offset, span)` for every span, offsets into the flat buffer.
pub(crate) fn offsets(spans: &[Span]) -> impl Iterator<Item = (usize, Span)> + '_ {
    spans.iter().scan(0usize, |at, s| {
        let o = *at;
        *at += s.len;
        Some((o, *s))
    })
}
