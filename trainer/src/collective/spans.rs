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

/// Where each non-empty span lies: its offset in the flat buffer, and for a span `rank` owns, its
/// offset among that rank's spans laid end to end (what a reduce-scatter returns and an
/// all-gather takes), in span order.
pub(crate) fn placed(spans: &[Span], rank: usize) -> impl Iterator<Item = (usize, Option<usize>, Span)> + '_ {
    offsets(spans).filter(|(_, s)| s.len > 0).scan(0usize, move |mine, (at, s)| {
        let here = (s.owner == rank).then(|| {
            *mine += s.len;
            *mine - s.len
        });
        Some((at, here, s))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The flat offsets tile the buffer in order, and a rank's own offsets tile its
        /// concatenation in order: NCCL writes each span into exactly its part.
        #[test]
        fn placements_tile_the_buffer_and_each_ranks_share(
            spans in prop::collection::vec((0usize..50, 0usize..4), 0..40),
            rank in 0usize..4,
        ) {
            let spans: Vec<Span> = spans.into_iter().map(|(len, owner)| Span { len, owner }).collect();
            let (mut flat, mut mine) = (0, 0);
            for (at, here, s) in placed(&spans, rank) {
                prop_assert!(s.len > 0);
                prop_assert!(at >= flat);
                flat = at + s.len;
                prop_assert_eq!(here.is_some(), s.owner == rank);
                if let Some(o) = here {
                    prop_assert_eq!(o, mine);
                    mine += s.len;
                }
            }
            prop_assert_eq!(flat, spans.iter().rposition(|s| s.len > 0).map_or(0, |i| total(&spans[..=i])));
            prop_assert_eq!(mine, owned(&spans, rank));
        }
    }
}
