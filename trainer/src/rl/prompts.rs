//! Which prompts a step takes: the training prompts in each epoch's shuffled order
//! ([`crate::data::epoch_order`], the same key as the packed data), `count` at a time, running
//! into the next epoch so every step is full. The [`DataCursor`] (epoch, position) is the
//! whole state, saved with each checkpoint.

use crate::data::{DataCursor, epoch_order};

/// The next `count` prompt indices out of `n`, and the cursor after them.
pub fn next_prompts(n: usize, count: usize, cursor: DataCursor, seed: u64, shuffle: bool) -> (Vec<usize>, DataCursor) {
    if n == 0 {
        return (Vec::new(), cursor);
    }
    let DataCursor { mut epoch, position } = cursor;
    let mut position = position as usize;
    let mut order = epoch_order(n, seed, epoch, shuffle);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        if position >= n {
            epoch += 1;
            position = 0;
            order = epoch_order(n, seed, epoch, shuffle);
        }
        out.push(order[position]);
        position += 1;
    }
    if position >= n {
        (out, DataCursor { epoch: epoch + 1, position: 0 })
    } else {
        (out, DataCursor { epoch, position: position as u64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_cover_each_epoch_once_and_resume_exactly() {
        let (mut all, mut cursor) = (Vec::new(), DataCursor::default());
        for _ in 0..5 {
            let (got, next) = next_prompts(7, 3, cursor, 9, true);
            assert_eq!(got.len(), 3);
            all.extend(got);
            cursor = next;
        }
        let mut first: Vec<usize> = all[..7].to_vec();
        first.sort_unstable();
        assert_eq!(first, (0..7).collect::<Vec<_>>());
        assert_eq!(cursor, DataCursor { epoch: 2, position: 1 });
        // From a saved cursor, the same continuation.
        let (a, _) = next_prompts(7, 4, DataCursor { epoch: 1, position: 2 }, 9, true);
        assert_eq!(a, all[9..13]);
        assert_eq!(
            next_prompts(3, 3, DataCursor::default(), 9, false),
            (vec![0, 1, 2], DataCursor { epoch: 1, position: 0 })
        );
    }
}
